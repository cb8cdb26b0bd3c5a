"""Fleet: the run's rollout instances as Ray actors, from the driver's side. It places
instances (reserved ones at once, preemptible ones as the capacity source says), preempts
them with a notice or suddenly, and kills their actors when they end. It asks the
controller nothing: the controller owns each instance's lifecycle and pushes its events
(controller/events.py), which one listener thread takes in order and turns into
events.jsonl lines (per instance: join, active, first_sample, notice, drained, gone or
death), bills, kills, and the view its waits wait on. No Ray call is made under the
fleet's lock. A reserved engine that dies is replaced at once under the same name; one
whose engine fails to start or to load a version fails wait_version with its cause.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.instance import InstanceSpec, PullRecord, RolloutInstance, one_line
from rlboost.controller.events import LIFECYCLE, InstanceEvent
from rlboost.errors import InstanceFailed

# Why an instance ended. "gone" events: its notice's deadline came, or the run shut its fleet
# down. "death" events: the run killed it without notice (a sudden preemption), it was lost
# (its process or node died, or it stopped answering), or its engine failed.
GONE_REASONS = ("reclaimed", "shutdown")
DEATH_REASONS = ("killed", "lost", "failed")
# Who decided an instance event: the availability trace (and injected preemptions), a cloud's
# notice, a node's shutdown hook (`rlboost notice`), the Ray cluster's nodes (a node joined,
# left or died; an instance lost), or the run itself (reserved engines, failures, shutdown).
SOURCES = ("trace", "cloud", "hook", "node", "run")
LISTEN_S = 30.0  # one long wait of the listener on the controller's next events
ACK_S = 10.0  # how long an end waits for the controller to write the instance off before the kill
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Member:
    spec: InstanceSpec
    placed_at: float
    handle: Any = None
    ready: Any = None  # concurrent Future of ready(): the engine is built, or failed to
    node: str | None = None  # the Ray node it was placed on, when the fleet chose one
    alive: bool = True  # placed and not ended, as far as the fleet knows
    noticed: bool = False
    notice_source: str = ""
    drained: bool = False
    ended_at: float | None = None  # when the fleet ended it (billing stops then)
    billed: bool = False
    state: str = "joining"  # the controller's, from its events
    version: int = -1
    failure: str | None = None


class Fleet:
    """Rollout instances of one run.

    template: an InstanceSpec whose instance_id/kind/source are replaced per instance.
    record(kind, instance=..., pool=..., preemptible_up=..., reserved_up=..., **more)
    appends one event line (events.jsonl; the counts are the controller's: instances
    placed and not ended after the event, starting and draining ones included); a death
    also carries its reason (DEATH_REASONS), samples_resumed (the samples the controller
    had on it, resumed elsewhere from their last collected token) and, for a failure, its
    cause. now() is the run's clock in seconds, shared with the ledger.
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
        self._changed = threading.Condition(self._lock)  # notified whenever the fleet's view changes
        self._seq = 0  # the last controller event applied
        self._inbox: queue.Queue = queue.Queue()  # what the listener acts on, in arrival order
        self._events = None  # the controller call that waits for the next events
        self._timers: list[threading.Timer] = []
        self._waits: set[threading.Event] = set()
        self._stop = threading.Event()
        self.preemptions = {"notice": 0, "sudden": 0}
        self._listener = threading.Thread(target=self._listen, name="fleet-events", daemon=True)
        self._listener.start()

    # -- placing and ending instances -------------------------------------------------------------

    def join(self, instance_id: str, kind: str = "preemptible", *, node: str | None = None,
             source: str | None = None) -> None:
        """Start an instance actor (on Ray node `node` when given); it registers and pulls the
        current weights by itself. source: who placed it (default: run for reserved engines,
        trace for preemptible instances)."""
        source = source or ("run" if kind == "reserved" else "trace")
        spec = dataclasses.replace(self.template, instance_id=instance_id, kind=kind, source=source)
        options = self.actor_options(kind)
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        member = _Member(spec, self.now(), node=node)
        with self._lock:
            if instance_id in self._members and self._members[instance_id].alive:
                raise ValueError(f"instance {instance_id!r} is already running")
            self._members[instance_id] = member
        self.controller.place.remote(instance_id, kind, {"source": source, **({"node": node} if node else {})})
        member.handle = ray.remote(RolloutInstance).options(name=None, **options).remote(spec, self.controller)
        member.ready = member.handle.ready.remote().future()
        member.ready.add_done_callback(lambda _, m=member: self._inbox.put(("ready", m)))

    def notice(self, instance_id: str, grace_s: float, source: str = "trace", **more: Any) -> None:
        """Preemption with notice: the controller drains it (one still starting takes the
        notice too); the actor is killed after grace_s. more: fields of the notice event
        (e.g. the cloud that sent it)."""
        with self._lock:
            member = self._members.get(instance_id)
            if member is None or not member.alive or member.noticed:
                return
            member.noticed, member.notice_source = True, source
            self.preemptions["notice"] += 1
            timer = threading.Timer(grace_s, self._reclaim, args=(instance_id, member))
            timer.daemon = True
            self._timers.append(timer)
        self.controller.notice.remote(instance_id, grace_s, {"source": source, **more})
        timer.start()

    def kill(self, instance_id: str, source: str = "trace") -> None:
        """Preemption without notice: the controller writes the instance off, then its actor dies."""
        member = self._end(instance_id, lambda m: True)
        if member is not None:
            with self._lock:
                self.preemptions["sudden"] += 1
            self._write_off(instance_id, member, "death", {"reason": "killed", "source": source})

    def node_gone(self, instance_id: str) -> None:
        """Its Ray node left or died: the instance ends now (gone, reclaimed, after a notice;
        else a death), and the controller is told at once, so its samples resume elsewhere
        without waiting for missed heartbeats."""
        member = self._end(instance_id, lambda m: True)
        if member is None:
            return
        if member.noticed:
            self._write_off(instance_id, member, "gone", {"reason": "reclaimed", "source": member.notice_source})
        else:
            self._write_off(instance_id, member, "death", {"reason": "lost", "source": "node"})

    def _reclaim(self, instance_id: str, member: _Member) -> None:
        if self._stop.is_set() or self._end(instance_id, lambda m: m is member) is None:
            return
        self._write_off(instance_id, member, "gone", {"reason": "reclaimed", "source": member.notice_source})

    def _end(self, instance_id: str, this: Callable[[_Member], bool]) -> _Member | None:
        """The fleet ends a live instance now (its billing stops now); None if it was not live."""
        with self._lock:
            member = self._members.get(instance_id)
            if member is None or not member.alive or not this(member):
                return None
            member.alive, member.ended_at = False, self.now()
            self._changed.notify_all()
            return member

    def _write_off(self, instance_id: str, member: _Member, event: str, details: dict) -> None:
        """Tell the controller (its samples resume elsewhere, and the end comes back as an
        event), then kill the actor once it has, or ACK_S later."""
        try:
            ray.wait([self.controller.end.remote(instance_id, event, details)], timeout=ACK_S)
        except Exception:  # the controller is gone: the kill still comes
            pass
        _kill(member.handle)

    def close(self) -> None:
        """Stop listening and end every instance (billing stops now; each is recorded gone)."""
        self._stop.set()
        for timer in self._timers:
            timer.cancel()
        self.stop_waits()
        self._inbox.put(("stop", None))  # after a last look at the controller's events
        self._listener.join(timeout=15)
        with self._lock:
            live = [iid for iid, m in self._members.items() if m.alive]
            up = {kind: self.up(kind) for kind in ("preemptible", "reserved")}
            for iid in live:
                m = self._members[iid]
                m.alive, m.ended_at = False, self.now()
        for iid in live:
            _kill(self._members[iid].handle)
        for iid in live:  # the run ends them itself: the controller is closing
            m = self._members[iid]
            up[m.spec.kind] -= 1
            self.record("gone", instance=iid, pool=m.spec.kind, preemptible_up=up["preemptible"],
                        reserved_up=up["reserved"], reason="shutdown", source="run")
        self._settle_bills()

    def _settle_bills(self) -> None:
        """Every preemptible instance is billed from placement to end, reported or not."""
        for iid, m in self._members.items():
            if m.spec.kind != "reserved" and not m.billed:
                m.billed = True
                self.ledger.start(iid, m.spec.kind, at_s=m.placed_at, source=m.spec.source)
            if iid in self.ledger.running():
                self.ledger.stop(iid, at_s=m.ended_at if m.ended_at is not None else self.now())

    # -- the controller's events --------------------------------------------------------------

    def _listen(self) -> None:
        self._ask_events()
        while True:
            what, item = self._inbox.get()
            try:
                if what == "stop":  # what the controller said before the end is recorded first
                    self._apply(ray.get(self.controller.next_events.remote(self._seq, 0.0), timeout=5.0))
                    return
                if what == "events":
                    self._apply(item.result())
                    if not self._stop.is_set():
                        self._ask_events()
                else:
                    self._started(item)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                log.info("the controller is gone: the fleet stops following its events")
                if what == "stop":
                    return
            except Exception:  # keep listening: one bad event must not end the event log
                log.exception("fleet listener failed on %s", what)
                if what == "stop":
                    return
                if what == "events" and not self._stop.is_set():
                    self._ask_events()

    def _ask_events(self) -> None:
        self._events = self.controller.next_events.remote(self._seq, LISTEN_S)
        self._events.future().add_done_callback(lambda f: self._inbox.put(("events", f)))

    def _started(self, member: _Member) -> None:
        """An instance's engine is built, or failed to be. An engine that raised has reported
        its cause to the controller itself; an actor that died before it could is ended here."""
        error = member.ready.exception()
        if error is None or isinstance(getattr(error, "cause", None), InstanceFailed):
            return
        iid = member.spec.instance_id
        if self._end(iid, lambda m: m is member) is not None:
            self._write_off(iid, member, "death", {"reason": "failed", "source": "run", "cause": one_line(error)})

    def _apply(self, events: list[InstanceEvent]) -> None:
        for event in events:
            with self._lock:
                if event.seq <= self._seq:
                    continue
                self._seq = event.seq
                member = self._members.get(event.instance_id)
                todo = self._follow(event, member) if member is not None else None
            if event.kind in LIFECYCLE:
                self.record(event.kind, instance=event.instance_id, pool=event.pool,
                            preemptible_up=event.preemptible_up, reserved_up=event.reserved_up, **event.details)
            if todo is not None:
                todo()
            with self._lock:
                self._changed.notify_all()

    def _follow(self, event: InstanceEvent, m: _Member) -> Callable[[], None] | None:
        """The fleet's view after one event (under the lock); returns what to do after its line."""
        kind, d, iid = event.kind, event.details, event.instance_id
        if kind == "join" and m.spec.kind != "reserved" and not m.billed:  # the reserved cluster is billed as a whole
            m.billed = True
            self.ledger.start(iid, m.spec.kind, at_s=m.placed_at, source=m.spec.source)
        elif kind == "loaded":
            m.state, m.version = d["state"], d["weight_version"]
        elif kind == "drained":
            m.drained = True
        elif kind in ("gone", "death"):
            ended_here = m.alive
            m.alive, m.state = False, kind
            m.ended_at = m.ended_at if m.ended_at is not None else self.now()
            if iid in self.ledger.running():
                self.ledger.stop(iid, at_s=m.ended_at)
            if d.get("reason") == "failed":
                m.failure = f"{m.spec.kind} instance {iid}: {d.get('cause', 'failed')}"
            if ended_here:  # the controller ended it (lost, failed): its actor goes too
                rejoin = m.spec.kind == "reserved" and d.get("reason") == "lost" and not self._stop.is_set()
                return lambda: (_kill(m.handle), rejoin and self.join(iid, "reserved"))
        return None

    # -- waits and views -----------------------------------------------------------------------

    def wait_version(self, version: int, kind: str, timeout_s: float) -> float:
        """Block until every live instance of a kind is active at `version` (its events
        recorded); returns seconds waited. InstanceFailed, at once, naming the instance and
        the cause, when one of that kind failed to start or to load a version."""
        t0 = time.monotonic()
        with self._changed:
            while True:
                members = [m for m in self._members.values() if m.spec.kind == kind]
                failed = [m.failure for m in members if m.failure is not None]
                if failed:
                    raise InstanceFailed(failed[0])
                pending = sorted(m.spec.instance_id for m in members
                                 if m.alive and not m.noticed and (m.state != "active" or m.version != version))
                if not pending:
                    return time.monotonic() - t0
                left = timeout_s - (time.monotonic() - t0)
                if left <= 0:
                    raise TimeoutError(f"{pending} did not load weight version {version} within {timeout_s:.0f} s")
                self._changed.wait(left)

    def wait_ended(self, instance_id: str, timeout_s: float) -> bool:
        """Block until the instance has ended (True; also for one never started) or
        timeout_s has passed (False)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: instance_id not in self._members or not self._members[instance_id].alive
                or self._stop.is_set(), timeout_s)

    def wait_busy(self, instance_id: str, timeout_s: float) -> bool:
        """Wait (up to timeout_s) until the controller holds samples on the instance (it
        answers when it does); False on timeout, or at once when stop_waits() is called."""
        woken, answer = threading.Event(), []
        with self._lock:
            if self._stop.is_set():
                return False
            self._waits.add(woken)
        ref = self.controller.wait_busy.remote(instance_id, timeout_s)
        ref.future().add_done_callback(lambda f: (answer.append(f), woken.set()))
        woken.wait(timeout_s + ACK_S)
        with self._lock:
            self._waits.discard(woken)
        return bool(answer) and answer[0].exception() is None and bool(answer[0].result())

    def stop_waits(self) -> None:
        """End every wait_busy() now (the run, or its trace replay, is stopping)."""
        with self._lock:
            for woken in self._waits:
                woken.set()

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
        if m is None or m.ready is None or not m.ready.done():
            return m is None, None
        return True, m.ready.exception()

    def pull_records(self, version: int, timeout_s: float = 10.0) -> list[PullRecord]:
        """Pulls of `version` by the instances up now (and any fetched before). Instances
        still starting are not asked: they would answer only once started."""
        with self._lock:
            live = [m for m in self._members.values()
                    if m.alive and m.ready is not None and m.ready.done() and m.ready.exception() is None]
        refs = [m.handle.pulls.remote() for m in live]
        for ref in refs:
            try:
                for rec in ray.get(ref, timeout=timeout_s):
                    self._pulls[(rec.instance_id, rec.version)] = rec
            except Exception:  # preempted meanwhile: its earlier records stay
                continue
        for key in [k for k in self._pulls if k[1] < version - 1]:
            del self._pulls[key]
        return [r for (_, v), r in sorted(self._pulls.items()) if v == version]


def _kill(handle: Any) -> None:
    if handle is None:
        return
    try:
        ray.kill(handle, no_restart=True)
    except ValueError:  # its node is gone, and the actor with it
        pass
