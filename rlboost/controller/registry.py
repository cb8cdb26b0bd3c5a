"""Registry of rollout instances: the one owner of each instance's lifecycle. Leases renewed
by heartbeats, weight-version gating, notices and drains, and the ordered events
(controller/events.py) that tell the driver each step of an instance's life.

An instance moves joining -> pulling -> active -> draining, and ends gone (drained, reclaimed
or shut down) or lost (it died, stopped answering, or its engine failed). It is placed
(billed) from its join until the driver ends it. Only an instance whose weights are current
is given new samples: an active one, or a draining one for samples that fit before its drain
time. With bounded staleness (controller.max_staleness N >= 1) an instance up to N versions
behind the running step stays active (its samples in flight keep decoding) while it pulls
the current version. Time comes from an injected clock, so lease expiry is deterministic in
tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rlboost.controller.clock import Clock
from rlboost.controller.events import EventLog
from rlboost.controller.records import InstanceInfo, Lease
from rlboost.errors import RolloutError

JOINING, PULLING, ACTIVE, DRAINING, GONE, LOST = "joining", "pulling", "active", "draining", "gone", "lost"
STATES = (JOINING, PULLING, ACTIVE, DRAINING, GONE, LOST)
ENDED = (GONE, LOST)


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
    """The registry's mutable view of one life of one instance.

    registered: the instance has introduced itself (a placed one may still be starting);
    placed: it is billed (from its join until the driver ends it, or until it is lost
    without a notice); noticed/served/drained: what was already told of it."""

    info: InstanceInfo
    state: str
    weight_version: int
    last_beat: float
    joined_at: float
    drain_at: float | None = None
    deadline: float | None = None
    gone_reason: str = ""
    registered: bool = False
    placed: bool = True
    noticed: bool = False
    served: bool = False
    drained: bool = False
    activated: bool = False
    source: str = ""

    @property
    def instance_id(self) -> str:
        return self.info.instance_id

    @property
    def kind(self) -> str:
        return self.info.kind

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class Registry:
    """Who can take work now, at which weight version, and until when; and what happened to
    each instance, as ordered events (`events`)."""

    def __init__(self, config: RegistryConfig, clock: Clock, *, max_staleness: int = 0,
                 events: EventLog | None = None):
        self.config = config
        self.clock = clock
        self.max_staleness = max_staleness  # controller.max_staleness
        self.events = events if events is not None else EventLog()
        self._records: dict[str, InstanceRecord] = {}
        # notices that overtook their instance's placement (the driver's calls may land in
        # either order): deadline, grace and details, applied when the instance is added
        self._early_notices: dict[str, tuple[float, float, dict]] = {}
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

    # -- joining ---------------------------------------------------------------------------

    def place(self, instance_id: str, kind: str, **details: Any) -> None:
        """The driver placed an instance (it is billed from now and starts on its own):
        state joining, and a join event, unless the instance has registered already."""
        old = self._records.get(instance_id)
        if old is not None and old.placed:
            old.source = old.source or str(details.get("source", ""))
            return
        now = self.clock.now()
        info = InstanceInfo(instance_id=instance_id, kind=kind, capacity=1)  # its own comes at register
        self._add(InstanceRecord(info=info, state=JOINING, weight_version=-1, last_beat=now, joined_at=now,
                                 source=str(details.get("source", ""))), details)

    def register(self, info: InstanceInfo) -> Lease:
        """The instance introduces itself: a placed one keeps its state (a notice may have
        come first); one never placed, or a new life of an ended one, joins now."""
        old = self._records.get(info.instance_id)
        if old is not None and old.registered and old.placed and not old.ended:
            raise ValueError(f"instance {info.instance_id!r} is already registered ({old.state})")
        now = self.clock.now()
        if old is not None and old.placed and not old.registered:
            if info.kind != old.kind:
                raise ValueError(f"instance {info.instance_id!r} was placed as {old.kind}, not {info.kind}")
            old.info, old.registered, old.last_beat = info, True, now
            self._order = None
            return self._lease(old)
        rec = InstanceRecord(info=info, state=JOINING, weight_version=-1, last_beat=now, joined_at=now,
                             registered=True, source=info.source)
        self._add(rec, {"source": info.source} if info.source else {})
        return self._lease(rec)

    def _add(self, rec: InstanceRecord, details: dict) -> None:
        self._records[rec.instance_id] = rec
        self._order = None
        self._emit("join", rec, **details)
        early = self._early_notices.pop(rec.instance_id, None)
        if early is not None:
            self._take_notice(rec, *early)

    # -- leases ----------------------------------------------------------------------------

    def heartbeat(self, instance_id: str, weight_version: int | None = None) -> Lease:
        """Renew the lease; a reported weight version moves the instance between pulling and active.
        An instance's weights only move forward: a report older than the one it already made
        was sent before its last load finished and arrives late (a load() answered before the
        new version was in, a heartbeat sent as it loaded), and is ignored."""
        rec = self._live(instance_id)
        rec.last_beat = self.clock.now()
        if weight_version is not None and int(weight_version) > rec.weight_version:
            rec.weight_version = int(weight_version)
            self._restate_one(rec, reported=True)
        elif rec.state == JOINING:
            self._restate_one(rec)
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
                self._restate_one(rec)

    def _restate_one(self, rec: InstanceRecord, reported: bool = False) -> None:
        """Active or pulling by the version it holds; the driver hears of every change, and of
        the first time it is active (unless a notice came first)."""
        if rec.state not in (JOINING, PULLING, ACTIVE):
            return
        was = rec.state
        rec.state = ACTIVE if self.version_ok(rec.weight_version) else PULLING
        if rec.state == ACTIVE and not rec.activated:
            rec.activated = True
            self._emit("active", rec, pid=rec.info.pid, node=rec.info.host)
        if reported or rec.state != was:
            self._emit("loaded", rec, weight_version=rec.weight_version, state=rec.state)

    # -- notices, drains and ends ----------------------------------------------------------

    def notice(self, instance_id: str, grace_s: float, **details: Any) -> float:
        """A preemption notice (an instance still starting takes it too): its samples must
        leave before the returned deadline (only those that fit before its drain time are
        still routed to it, see RegistryConfig)."""
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        now = self.clock.now()
        deadline = now + grace_s
        if instance_id not in self._records:  # not placed yet: the notice waits for it
            self._early_notices[instance_id] = (deadline, grace_s, details)
            return deadline
        return self._take_notice(self._live(instance_id, registered=False), deadline, grace_s, details)

    def _take_notice(self, rec: InstanceRecord, deadline: float, grace_s: float, details: dict) -> float:
        now = self.clock.now()
        if rec.deadline is not None:
            deadline = min(deadline, rec.deadline)
        rec.state, rec.deadline = DRAINING, deadline
        rec.drain_at = max(now, deadline - self.config.drain_margin_s)
        if not rec.noticed:
            rec.noticed = True
            rec.source = str(details.get("source", rec.source))
            self._emit("notice", rec, grace_s=grace_s, **details)
        return deadline

    def served(self, instance_id: str, samples: int) -> None:
        """The controller holds samples on the instance: the first time, the driver hears of it."""
        rec = self._records.get(instance_id)
        if rec is not None and not rec.served and not rec.ended:
            rec.served = True
            self._emit("first_sample", rec, samples=samples)

    def mark_gone(self, instance_id: str, reason: str) -> None:
        """The controller let the instance go (drained after its notice, or shut down); it
        stays placed until the driver ends it."""
        rec = self._records.get(instance_id)
        if rec is not None and not rec.ended:
            rec.state, rec.gone_reason = GONE, reason
            self._drained(rec)

    def mark_lost(self, instance_id: str, reason: str, *, samples: int = 0, cause: str = "") -> None:
        """The instance died, stopped answering or failed: lost. Without a notice it ends here
        (a death, with the samples that resume elsewhere); a noticed one has drained, and
        the driver ends it at its deadline."""
        rec = self._records.get(instance_id)
        if rec is None or rec.ended:
            return
        rec.state, rec.gone_reason = LOST, reason
        if rec.noticed:
            self._drained(rec)
            return
        rec.placed = False
        if cause:  # its engine failed to start or to load a version: the run's own doing
            self._emit("death", rec, reason="failed", samples_resumed=samples, source="run", cause=cause)
        else:
            self._emit("death", rec, reason="lost", samples_resumed=samples, source="node")

    def end(self, instance_id: str, event: str, *, samples: int = 0, **details: Any) -> None:
        """The driver ended the instance (event gone: reclaimed or shutdown; death: killed,
        lost or failed); it is no longer placed. A noticed one that had not drained yet has
        its samples' departure recorded first."""
        if event not in ("gone", "death"):
            raise ValueError(f"event must be gone or death, got {event!r}")
        rec = self._records.get(instance_id)
        if rec is None or not rec.placed:
            return
        if rec.noticed:
            self._drained(rec)
        if not rec.ended:
            rec.state = GONE if event == "gone" else LOST
            rec.gone_reason = str(details.get("reason", event))
        rec.placed = False
        if event == "death":
            details = {"samples_resumed": samples, **details}
        elif rec.noticed:
            details = {**details, "source": rec.source or details.get("source", "")}
        self._emit(event, rec, **details)

    def _drained(self, rec: InstanceRecord) -> None:
        if rec.noticed and not rec.drained:
            rec.drained = True
            self._emit("drained", rec, source=rec.source)

    def expire(self, samples_of: Callable[[str], int] = lambda iid: 0) -> list[str]:
        """Declare lost every registered instance silent for missed_beats intervals (with the
        samples it held, samples_of(id), resuming elsewhere); return their ids."""
        now = self.clock.now()
        limit = self.config.heartbeat_interval_s * self.config.missed_beats
        dead = sorted(r.instance_id for r in self._records.values()
                      if not r.ended and r.registered and now - r.last_beat > limit)
        for iid in dead:
            self.mark_lost(iid, f"no heartbeat for {limit:g} s", samples=samples_of(iid))
        return dead

    # -- views -----------------------------------------------------------------------------

    def get(self, instance_id: str) -> InstanceRecord | None:
        return self._records.get(instance_id)

    def live(self) -> list[InstanceRecord]:
        """Registered instances not ended, in id order."""
        if self._order is None:  # asked every controller round; records change only on register
            self._order = [r for _, r in sorted(self._records.items())]
        return [r for r in self._order if not r.ended and r.registered]

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

    def placed(self, kind: str) -> int:
        """Instances of a kind placed and not yet ended (starting and draining ones included)."""
        return sum(1 for r in self._records.values() if r.placed and r.kind == kind)

    def peers(self, instance_id: str) -> tuple[str, ...]:
        """Relay addresses of the other instances that are up and not under notice: where an
        instance pulls a weight version from besides the trainer."""
        return tuple(sorted(r.info.relay_address for r in self._records.values()
                            if r.instance_id != instance_id and r.registered and not r.ended and not r.noticed
                            and r.info.relay_address))

    def _live(self, instance_id: str, registered: bool = True) -> InstanceRecord:
        rec = self._records.get(instance_id)
        if rec is None or (registered and not rec.registered):
            raise RolloutError(f"instance {instance_id!r} is not registered")
        if rec.ended:
            raise RolloutError(f"instance {instance_id!r} is {rec.state} ({rec.gone_reason}); register it again")
        return rec

    def _emit(self, kind: str, rec: InstanceRecord, **details: Any) -> None:
        self.events.append(kind, rec.instance_id, rec.kind, self.clock.now(),
                           (self.placed("preemptible"), self.placed("reserved")), **details)

    def _lease(self, rec: InstanceRecord) -> Lease:
        return Lease(instance_id=rec.instance_id, state=rec.state, weight_version=self._version,
                     renew_within_s=self.config.heartbeat_interval_s, peers=self.peers(rec.instance_id))
