"""Fleet: the run's rollout instances as Ray actors, from the driver's side.

It starts instances (reserved ones at once, preemptible ones as the capacity source says:
a trace, or the Ray cluster's nodes), preempts them with a notice (the controller drains
them, the actor is killed at the deadline) or suddenly (the actor is killed; the
controller finds out on its next call), and records every instance event in the run
directory's events.jsonl (in causal order per instance: join, then active, then notice,
then drained, then its end; a preemptible instance's first_sample after its active) with
the event's source (SOURCES), and every instance lifetime in the cost ledger. A watcher
thread follows the controller's view (first time active, first sample, drained, gone) and
keeps each instance's list of relay peers current. An instance that dies on its own (its
process or its node) is recorded as a death like a sudden preemption; a reserved engine
that dies is replaced at once, under the same name.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.instance import InstanceSpec, PullRecord, RolloutInstance
from rlboost.cluster.session import process_info

WATCH_INTERVAL_S = 0.25
# Why an instance ended. "gone" events: its notice's deadline came, or the run shut its
# fleet down. "death" events: the run killed it without notice (a sudden preemption), or it
# was lost (its process or node died, or it stopped answering, and the controller dropped it).
GONE_REASONS = ("reclaimed", "shutdown")
DEATH_REASONS = ("killed", "lost")
# Who decided an instance event: the availability trace (and injected preemptions), a cloud's
# notice, a node's shutdown hook (`rlboost notice`), the Ray cluster's nodes (a node joined,
# left or died; an instance lost), or the run itself (reserved engines, shutdown).
SOURCES = ("trace", "cloud", "hook", "node", "run")
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Member:
    spec: InstanceSpec
    handle: Any
    ready: Any  # ObjectRef of ready(): the relay address
    process: Any  # ObjectRef of process_info(): where the actor runs
    node: str | None = None  # the Ray node it was placed on, when the fleet chose one
    relay: str | None = None
    alive: bool = True
    noticed: bool = False
    notice_source: str = ""
    deadline: float | None = None  # run clock; a notice the controller has not received yet
    delivered: bool = False  # the controller has its notice
    drained: bool = False
    served: bool = False  # the controller has had samples on it
    seen: set = field(default_factory=set)  # controller states seen (this life)
    samples: int = 0  # samples the controller had on it when last seen


class Fleet:
    """Rollout instances of one run.

    template: an InstanceSpec whose instance_id/kind are replaced per instance.
    record(kind, instance=..., pool=..., preemptible_up=..., reserved_up=..., **more)
    appends one event (events.jsonl; the counts are instances placed and not ended after
    the event, starting and draining ones included; `source` is one of SOURCES, and the end
    of a noticed instance carries its notice's); a death event also carries its reason
    (DEATH_REASONS) and samples_resumed, the samples the controller had on the instance
    when last seen (they resume elsewhere from their last collected token). now() is the
    run's clock in seconds, shared with the ledger.
    """

    def __init__(self, controller: Any, template: InstanceSpec, actor_options: Callable[[str], dict],
                 ledger: CostLedger, record: Callable[..., None], now: Callable[[], float]):
        self.controller = controller
        self.template = template
        self.actor_options = actor_options
        self.ledger, self.record, self.now = ledger, record, now
        self._members: dict[str, _Member] = {}
        self._pulls: dict[tuple[str, int], PullRecord] = {}
        self._lock = threading.RLock()
        # observations are numbered when asked for; one answered after a newer one was
        # applied is dropped (it could miss an instance that registered in between)
        self._asked = itertools.count(1)
        self._applied = 0
        self._ended = threading.Condition(self._lock)  # notified whenever an instance ends
        self._timers: list[threading.Timer] = []
        self._stop = threading.Event()
        self._peers: tuple[str, ...] = ()
        self._watcher = threading.Thread(target=self._watch, name="fleet-watch", daemon=True)
        self.preemptions = {"notice": 0, "sudden": 0}

    def start(self) -> None:
        self._watcher.start()

    # -- membership ----------------------------------------------------------------------------

    def join(self, instance_id: str, kind: str = "preemptible", *, node: str | None = None,
             source: str | None = None) -> None:
        """Start an instance actor (on Ray node `node` when given); it registers and pulls the
        current weights by itself. source: who placed it (default: run for reserved engines,
        trace for preemptible instances)."""
        source = source or ("run" if kind == "reserved" else "trace")
        spec = dataclasses.replace(self.template, instance_id=instance_id, kind=kind)
        options = self.actor_options(kind)
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        actor = ray.remote(RolloutInstance).options(name=None, **options)
        handle = actor.remote(spec, self.controller)
        with self._lock:
            if instance_id in self._members and self._members[instance_id].alive:
                raise ValueError(f"instance {instance_id!r} is already running")
            self._members[instance_id] = _Member(spec, handle, handle.ready.remote(),
                                                 handle.__ray_call__.remote(process_info), node=node)
            if kind != "reserved":  # reserved engines run on the reserved cluster, billed as a whole
                self.ledger.start(instance_id, kind, at_s=self.now(), source=source)
            self._record("join", instance_id, source=source, **({"node": node} if node else {}))

    def _record(self, kind: str, instance_id: str, **more: Any) -> None:
        """One instance event with the counts after it (under the lock, so counts and
        order agree with what happened)."""
        self.record(kind, instance=instance_id, pool=self._members[instance_id].spec.kind,
                    preemptible_up=self.up("preemptible"), reserved_up=self.up("reserved"), **more)

    def notice(self, instance_id: str, grace_s: float, source: str = "trace", **more: Any) -> None:
        """Preemption with notice: the controller drains it; the actor dies after grace_s.
        An instance still starting gets the notice as soon as it has registered (and is
        then never recorded active: it goes from starting to draining). more: fields of the
        notice event (e.g. the cloud that sent it)."""
        self._observe_now()
        with self._lock:
            member = self._members.get(instance_id)
            if member is None or not member.alive or member.noticed:
                return
            member.noticed, member.notice_source = True, source
            member.deadline = self.now() + grace_s
            self.preemptions["notice"] += 1
            self._record("notice", instance_id, grace_s=grace_s, source=source, **more)
            if member.seen:
                self._deliver_notice(instance_id, member)
        timer = threading.Timer(grace_s, self._reclaim, args=(instance_id,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _deliver_notice(self, instance_id: str, member: _Member) -> None:
        grace = max(0.0, member.deadline - self.now())
        member.deadline, member.delivered = None, True
        try:
            ray.get(self.controller.notice.remote(instance_id, grace), timeout=30)
        except (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
            pass  # already gone: the kill still comes at the deadline

    def kill(self, instance_id: str, source: str = "trace") -> None:
        """Preemption without notice: the actor process dies now."""
        self._observe_now()
        with self._lock:
            member = self._members.get(instance_id)
            if member is None or not member.alive:
                return
            self.preemptions["sudden"] += 1
            self._terminate(instance_id, "death", reason="killed", samples_resumed=member.samples, source=source)

    def node_gone(self, instance_id: str) -> None:
        """Its Ray node left or died: the instance ends now (gone, reclaimed, after a notice;
        else a death), and the controller is told at once, so its samples resume elsewhere
        without waiting for missed heartbeats."""
        with self._lock:
            member = self._members.get(instance_id)
            if member is None or not member.alive:
                return
            if member.noticed:
                self._terminate(instance_id, "gone", reason="reclaimed", source=member.notice_source)
            else:
                self._terminate(instance_id, "death", reason="lost", samples_resumed=member.samples, source="node")
        self.controller.deregister.remote(instance_id)

    def _reclaim(self, instance_id: str) -> None:
        with self._lock:
            member = self._members.get(instance_id)
            if not self._stop.is_set() and member is not None:
                self._terminate(instance_id, "gone", reason="reclaimed", source=member.notice_source)

    def _terminate(self, instance_id: str, event: str, **more: Any) -> None:
        member = self._members[instance_id]
        if not member.alive:
            return
        member.alive = False
        try:
            ray.kill(member.handle, no_restart=True)
        except ValueError:  # its node is gone, and the actor with it
            pass
        if instance_id in self.ledger.running():
            self.ledger.stop(instance_id, at_s=self.now())
        self._record(event, instance_id, **more)
        self._ended.notify_all()

    def wait_ended(self, instance_id: str, timeout_s: float) -> bool:
        """Block until the instance has ended (True; also for one never started) or
        timeout_s has passed (False)."""
        with self._ended:
            return self._ended.wait_for(
                lambda: instance_id not in self._members or not self._members[instance_id].alive
                or self._stop.is_set(), timeout_s)

    def announce(self) -> None:
        """Tell every live instance to check its lease now (a new version is current)."""
        with self._lock:
            for m in self._members.values():
                if m.alive:
                    m.handle.nudge.remote()

    def oldest(self, kind: str = "preemptible") -> str | None:
        """The longest-running live instance of a kind that is not under notice."""
        with self._lock:
            for iid, m in self._members.items():
                if m.alive and not m.noticed and m.spec.kind == kind:
                    return iid
        return None

    def up(self, kind: str = "preemptible") -> int:
        with self._lock:
            return sum(1 for m in self._members.values() if m.alive and m.spec.kind == kind)

    def on_node(self, node: str) -> list[str]:
        """The live instances the fleet placed on a Ray node."""
        with self._lock:
            return [iid for iid, m in self._members.items() if m.alive and m.node == node]

    def settled(self, instance_id: str) -> bool:
        """Ended, or drained after its notice (nothing of the run's is left on it)."""
        with self._lock:
            m = self._members.get(instance_id)
            return m is None or not m.alive or m.drained

    def start_outcome(self, instance_id: str) -> tuple[bool, BaseException | None]:
        """(done, error): whether the instance's actor has finished starting, and the error
        it failed with (None: it started, or is still starting)."""
        with self._lock:
            m = self._members.get(instance_id)
        if m is None:
            return True, None
        done, _ = ray.wait([m.ready], timeout=0)
        if not done:
            return False, None
        try:
            ray.get(done[0])
        except Exception as exc:
            return True, exc
        return True, None

    # -- observation ---------------------------------------------------------------------------

    def wait_version(self, version: int, kind: str, timeout_s: float) -> float:
        """Block until every live instance of a kind is active at `version`; returns seconds
        waited. An instance that failed to start raises its error here."""
        t0 = time.perf_counter()
        while True:
            with self._lock:
                members = {i: m for i, m in self._members.items() if m.alive and m.spec.kind == kind}
            done, _ = ray.wait([m.ready for m in members.values()], num_returns=len(members), timeout=0) \
                if members else ([], [])
            ray.get(done)  # raises the error of an instance whose start failed
            asked = next(self._asked)
            states = ray.get(self.controller.instances.remote())
            ok = {s.instance_id for s in states if s.state == "active" and s.weight_version == version}
            if set(members) <= ok:
                # what this wait saw is recorded before it returns: an instance reported active
                # here has its active event before any preemption that follows
                self._absorb(asked, {s.instance_id: s for s in states})
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"{sorted(set(members) - ok)} did not load weight version {version} "
                                   f"within {timeout_s:.0f} s")
            self._stop.wait(0.02)

    def wait_busy(self, instance_id: str, timeout_s: float, until: threading.Event | None = None) -> bool:
        """Wait (up to timeout_s) until the controller has samples on the instance; False at
        once when the fleet closes or `until` (the caller's own stop) is set."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = ray.get(self.controller.instances.remote())
            if any(s.instance_id == instance_id and s.samples > 0 for s in states):
                return True
            if time.monotonic() >= deadline or self._stop.wait(0.01) or (until is not None and until.is_set()):
                return False

    def pull_records(self, version: int, timeout_s: float = 10.0) -> list[PullRecord]:
        """Pulls of `version` by the instances up now (and any fetched before). Instances
        still starting are not asked: they would answer only once started."""
        with self._lock:
            live = [m for m in self._members.values() if m.alive]
        started, _ = ray.wait([m.ready for m in live], num_returns=len(live), timeout=0) if live else ([], [])
        refs = [m.handle.pulls.remote() for m in live if m.ready in started]
        for ref in refs:
            try:
                for rec in ray.get(ref, timeout=timeout_s):
                    self._pulls[(rec.instance_id, rec.version)] = rec
            except Exception:  # preempted meanwhile: its earlier records stay
                continue
        for key in [k for k in self._pulls if k[1] < version - 1]:
            del self._pulls[key]
        return [r for (_, v), r in sorted(self._pulls.items()) if v == version]

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            try:
                self._observe()
            except Exception:  # keep watching: a bad round must not end the event log
                log.exception("fleet watcher round failed")

    def _observe_now(self) -> None:
        """One watcher round now, before a preemption: an activation the watcher has not
        seen yet is recorded before the notice or death that follows it."""
        try:
            self._observe(timeout_s=5.0)
        except Exception:  # the preemption goes ahead; only the active event may be missing
            log.exception("fleet observation before a preemption failed")

    def _observe(self, timeout_s: float = 30.0) -> None:
        asked = next(self._asked)
        try:
            statuses = {s.instance_id: s for s in ray.get(self.controller.instances.remote(), timeout=timeout_s)}
        except ray.exceptions.GetTimeoutError:  # controller busy: try again next round
            return
        except ray.exceptions.RayActorError:  # the controller died: the driver finds out on its next call
            return
        self._absorb(asked, statuses)

    def _absorb(self, asked: int, statuses: dict) -> None:
        """Record what one observation of the controller's instances shows (activations,
        losses) and deliver notices held for instances that have registered."""
        with self._lock:
            if asked < self._applied:
                return
            self._applied = asked
            for iid, m in list(self._members.items()):
                status = statuses.get(iid)
                if status is None:
                    if m.alive and m.seen and not m.noticed:
                        self._lost(iid, m)
                    elif m.alive and m.seen and m.delivered and not m.drained:
                        self._drained(iid, m)  # the controller let it go: its samples have left
                    continue
                if status.state == "active" and "active" not in m.seen and m.alive and not m.noticed:
                    self._record("active", iid, **_ready_or_empty(m.process))
                if status.samples > 0 and not m.served and m.alive and m.spec.kind == "preemptible":
                    m.served = True
                    self._record("first_sample", iid, samples=status.samples)
                m.seen.add(status.state)
                m.samples = status.samples
                if m.deadline is not None and m.alive:
                    self._deliver_notice(iid, m)
            self._refresh_peers()

    def _drained(self, instance_id: str, member: _Member) -> None:
        member.drained = True
        self._record("drained", instance_id, source=member.notice_source)
        self._ended.notify_all()

    def _lost(self, instance_id: str, member: _Member) -> None:
        """The controller dropped a live instance (its process or node died, or it stopped
        answering): end it, and start a new reserved engine in a lost one's place."""
        log.warning("the controller dropped instance %s; ending it", instance_id)
        self._terminate(instance_id, "death", reason="lost", samples_resumed=member.samples, source="node")
        if member.spec.kind == "reserved" and not self._stop.is_set():
            self.join(instance_id, "reserved")

    def _refresh_peers(self) -> None:
        for m in self._members.values():
            if m.alive and m.relay is None:
                done, _ = ray.wait([m.ready], timeout=0)
                if done:
                    try:
                        m.relay = ray.get(m.ready)
                    except Exception:
                        m.relay = ""
        # An instance under notice pulls nothing more and soon vanishes: not a useful relay.
        peers = tuple(sorted(m.relay for m in self._members.values() if m.alive and m.relay and not m.noticed))
        if peers != self._peers:
            self._peers = peers
            for m in self._members.values():
                if m.alive and m.relay is not None:
                    m.handle.set_peers.remote(list(peers))

    def close(self) -> None:
        """Stop watching and end every instance (billing stops now; each is recorded gone)."""
        self._stop.set()
        for timer in self._timers:
            timer.cancel()
        if self._watcher.is_alive():
            self._watcher.join(timeout=5)
        with self._lock:
            for iid, m in self._members.items():
                if m.alive:
                    self._terminate(iid, "gone", reason="shutdown", source="run")


def _ready_or_empty(ref: Any) -> dict:
    done, _ = ray.wait([ref], timeout=0)
    if not done:
        return {}
    try:
        return ray.get(done[0])
    except Exception:  # it died meanwhile: its death is recorded next
        return {}
