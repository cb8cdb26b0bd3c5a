"""Registry of rollout instances: leases renewed by heartbeats, weight-version gating, drains.

An instance moves joining -> pulling -> active -> draining -> gone. Only an instance whose
weights are current is given new samples: an active one, or a draining one for samples that
fit before its drain time. With bounded staleness (controller.max_staleness N >= 1) an
instance up to N versions behind the running step stays active (its samples in flight keep
decoding) while it pulls the current version. Time comes from an injected clock, so lease
expiry is deterministic in tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.controller.clock import Clock
from rlboost.controller.records import InstanceInfo, Lease
from rlboost.errors import RolloutError

JOINING, PULLING, ACTIVE, DRAINING, GONE = "joining", "pulling", "active", "draining", "gone"


@dataclass(kw_only=True, slots=True)
class RegistryConfig:
    """Lease and drain settings.

    An instance is declared dead after missed_beats heartbeat intervals without a sign of
    life; a drained instance's samples leave drain_margin_s before its deadline (or at once
    when the grace period is shorter), so decoding continues while it safely can.

    With route_to_draining, a draining instance (billed until it is reclaimed) still takes
    new, stolen or migrated samples, but only those whose whole remaining token budget it
    would decode before its drain time at its measured per-sample rate; whatever is still
    unfinished then migrates as always. False: a notice stops all routing to it at once.
    """

    heartbeat_interval_s: float = 1.0
    """seconds between an instance's heartbeats (its lease renewals)"""
    missed_beats: int = 3
    """heartbeat intervals without a sign of life before an instance counts as dead"""
    drain_margin_s: float = 5.0
    """a noticed instance's samples leave this long before its deadline"""
    route_to_draining: bool = True
    """a noticed instance still takes samples that surely finish before its drain time"""

    def __post_init__(self) -> None:
        if not self.heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s must be > 0, got {self.heartbeat_interval_s}")
        if self.missed_beats < 1:
            raise ValueError(f"missed_beats must be >= 1, got {self.missed_beats}")
        if self.drain_margin_s < 0:
            raise ValueError(f"drain_margin_s must be >= 0, got {self.drain_margin_s}")
        if not isinstance(self.route_to_draining, bool):
            raise ValueError(f"route_to_draining must be True or False, got {self.route_to_draining!r}")


@dataclass(slots=True)
class InstanceRecord:
    """The registry's mutable view of one instance."""

    info: InstanceInfo
    state: str
    weight_version: int
    last_beat: float
    joined_at: float
    drain_at: float | None = None
    deadline: float | None = None
    gone_reason: str = ""

    @property
    def instance_id(self) -> str:
        return self.info.instance_id

    @property
    def kind(self) -> str:
        return self.info.kind


class Registry:
    """Who can take work now, at which weight version, and until when."""

    def __init__(self, config: RegistryConfig, clock: Clock, *, max_staleness: int = 0):
        self.config = config
        self.clock = clock
        self.max_staleness = max_staleness  # controller.max_staleness
        self._records: dict[str, InstanceRecord] = {}
        self._order: list[InstanceRecord] | None = None  # records in id order (None: re-sort)
        self._version = 0
        self._step_version = 0  # the version the running step trains (ahead of current: started early)

    @property
    def current_version(self) -> int:
        return self._version

    def version_ok(self, version: int) -> bool:
        """Whether an instance holding `version` may decode for the running step: within
        max_staleness of the step's version, and not newer than the current one."""
        return max(self._version, self._step_version) - self.max_staleness <= version <= self._version

    def set_step_version(self, version: int) -> None:
        """The version the running step's samples are trained on: the current one, or (a
        step started while the trainer still trains the one before) up to max_staleness
        ahead of it. Instances outside the step's window stop being routable."""
        if not self._version <= version <= self._version + self.max_staleness:
            raise ValueError(f"a step at version {version} cannot start while version {self._version} is "
                             f"current (max_staleness={self.max_staleness})")
        self._step_version = int(version)
        self._restate()

    def register(self, info: InstanceInfo) -> Lease:
        """Admit a new instance (or a new life of a gone one) in state joining."""
        old = self._records.get(info.instance_id)
        if old is not None and old.state != GONE:
            raise ValueError(f"instance {info.instance_id!r} is already registered ({old.state})")
        now = self.clock.now()
        rec = InstanceRecord(info=info, state=JOINING, weight_version=-1, last_beat=now, joined_at=now)
        self._records[info.instance_id] = rec
        self._order = None
        return self._lease(rec)

    def heartbeat(self, instance_id: str, weight_version: int | None = None) -> Lease:
        """Renew the lease; a reported weight version moves the instance between pulling and active."""
        rec = self._live(instance_id)
        rec.last_beat = self.clock.now()
        if weight_version is not None:
            rec.weight_version = int(weight_version)
        if rec.state in (JOINING, PULLING, ACTIVE):
            rec.state = ACTIVE if self.version_ok(rec.weight_version) else PULLING
        return self._lease(rec)

    def lease(self, instance_id: str) -> Lease:
        rec = self._records.get(instance_id)
        if rec is None:
            raise RolloutError(f"instance {instance_id!r} is not registered")
        return self._lease(rec)

    def set_weight_version(self, version: int) -> None:
        """Make version current; active instances that fall out of the allowed range start pulling."""
        if version < self._version:
            raise ValueError(f"weight version must not go back: {version} < {self._version}")
        self._version = int(version)
        self._step_version = max(self._step_version, self._version)
        self._restate()

    def _restate(self) -> None:
        for rec in self._records.values():
            if rec.state in (ACTIVE, PULLING):
                rec.state = ACTIVE if self.version_ok(rec.weight_version) else PULLING

    def notice(self, instance_id: str, grace_s: float) -> float:
        """A preemption notice: its samples must leave before the returned deadline (only
        those that fit before its drain time are still routed to it, see RegistryConfig)."""
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        rec = self._live(instance_id)
        now = self.clock.now()
        deadline = now + grace_s
        if rec.deadline is not None:
            deadline = min(deadline, rec.deadline)
        rec.state, rec.deadline = DRAINING, deadline
        rec.drain_at = max(now, deadline - self.config.drain_margin_s)
        return deadline

    def mark_gone(self, instance_id: str, reason: str) -> None:
        rec = self._records.get(instance_id)
        if rec is not None and rec.state != GONE:
            rec.state, rec.gone_reason = GONE, reason

    def expire(self) -> list[str]:
        """Declare dead every instance silent for missed_beats intervals; return their ids."""
        now = self.clock.now()
        limit = self.config.heartbeat_interval_s * self.config.missed_beats
        dead = [r.instance_id for r in self._records.values()
                if r.state != GONE and now - r.last_beat > limit]
        for iid in dead:
            self.mark_gone(iid, f"no heartbeat for {limit:g} s")
        return sorted(dead)

    def get(self, instance_id: str) -> InstanceRecord | None:
        return self._records.get(instance_id)

    def live(self) -> list[InstanceRecord]:
        if self._order is None:  # asked every controller round; records change only on register
            self._order = [r for _, r in sorted(self._records.items())]
        return [r for r in self._order if r.state != GONE]

    def routable(self, kind: str | None = None) -> list[InstanceRecord]:
        """Active instances at an allowed weight version, in id order."""
        return [r for r in self.live() if r.state == ACTIVE and self.version_ok(r.weight_version)
                and (kind is None or r.kind == kind)]

    def takes_work(self, rec: InstanceRecord) -> bool:
        """Whether rec may be given samples: active, or draining (with route_to_draining and
        before its drain time), holding the current weight version (one behind it, still
        allowed under bounded staleness, only finishes what it holds while it pulls)."""
        if rec.weight_version != self._version:
            return False
        if rec.state == ACTIVE:
            return True
        return (rec.state == DRAINING and self.config.route_to_draining
                and rec.drain_at is not None and rec.drain_at > self.clock.now())

    def time_left_s(self, rec: InstanceRecord) -> float | None:
        """Seconds until a draining instance's samples leave (None: not draining)."""
        if rec.state != DRAINING or rec.drain_at is None:
            return None
        return max(0.0, rec.drain_at - self.clock.now())

    def drains_due(self) -> list[InstanceRecord]:
        now = self.clock.now()
        return [r for r in self.live() if r.state == DRAINING and r.drain_at is not None and r.drain_at <= now]

    def _live(self, instance_id: str) -> InstanceRecord:
        rec = self._records.get(instance_id)
        if rec is None:
            raise RolloutError(f"instance {instance_id!r} is not registered")
        if rec.state == GONE:
            raise RolloutError(f"instance {instance_id!r} is gone ({rec.gone_reason}); register it again")
        return rec

    def _lease(self, rec: InstanceRecord) -> Lease:
        return Lease(instance_id=rec.instance_id, state=rec.state, weight_version=self._version,
                     renew_within_s=self.config.heartbeat_interval_s)
