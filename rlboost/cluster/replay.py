"""Replaying an availability trace on a live fleet: the trace (bundled sample, synthetic,
or a file) is capped to the fleet's size, compressed to the run's length and turned into
join / notice / kill events, which a thread applies at their times, in order: no instance
joins before the ones the trace has ended by then are gone, so the fleet never holds more
instances than the trace (and its cap) allows.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

from rlboost.cluster.fleet import Fleet
from rlboost.cluster.traces import (
    SAMPLES,
    AvailabilityTrace,
    InstanceEvent,
    PreemptionPolicy,
    SyntheticTraceConfig,
    load_trace,
    preemption_events,
    sample_trace,
    synthetic_trace,
)


def named_trace(name: str, *, max_count: int, seed: int = 0) -> AvailabilityTrace | None:
    """The trace called name ("sample", "synthetic", "none" or a path), capped at max_count
    instances (None for "none" or no preemptible capacity). Compress it to a run's length
    with .compressed_to()."""
    if name == "none" or max_count == 0:
        return None
    if name in SAMPLES:  # the bundled traces (synthetic samples of each format, and a measured one)
        trace = sample_trace(name)
    elif name == "synthetic":
        trace = synthetic_trace(SyntheticTraceConfig(capacity=max_count, seed=seed))
    else:
        trace = load_trace(name)
    return trace.capped(max_count)


def trace_events(trace: AvailabilityTrace | None, *, notice_s: float, sudden_fraction: float,
                 victim_order: str = "oldest", seed: int = 0) -> tuple[InstanceEvent, ...]:
    if trace is None:
        return ()
    policy = PreemptionPolicy(victim_order=victim_order, notice_s=notice_s,
                              sudden_fraction=sudden_fraction, seed=seed, id_prefix="spot-")
    return preemption_events(trace, policy)


class TraceReplay:
    """Applies events to a fleet at their times (seconds after start()).

    A notice ends in the fleet's own kill at the deadline; at the trace's announced kill
    the replay waits until that instance has ended (the deadline of a notice applied late
    comes late), so a replacement never joins beside the instance it replaces. Sudden
    kills (no notice) kill at once. With busy_wait_s > 0 a preemption first waits up to
    that long for its victim to hold samples, so that a short run's few preemptions meet
    work in flight; what comes after it keeps its time, unless that time has passed.
    """

    def __init__(self, fleet: Fleet, events: tuple[InstanceEvent, ...],
                 clock: Callable[[], float] = time.monotonic, busy_wait_s: float = 0.0):
        self.fleet, self.events, self.clock = fleet, events, clock
        self.busy_wait_s = busy_wait_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trace-replay", daemon=True)
        self.applied = 0
        self.error: BaseException | None = None

    def start(self, offset_s: float = 0.0) -> TraceReplay:
        """Replay from offset_s seconds into the trace (a resumed run continues where its
        checkpoint left the trace): instances up at that moment join at once, earlier
        events are skipped."""
        if offset_s < 0:
            raise ValueError(f"offset_s must be >= 0, got {offset_s}")
        self._start = self.clock() - offset_s
        self._due = self._from(offset_s)
        self._thread.start()
        return self

    @property
    def position_s(self) -> float:
        """Seconds into the trace (0 before start)."""
        return max(0.0, self.clock() - self._start) if hasattr(self, "_start") else 0.0

    def _from(self, offset_s: float) -> list[InstanceEvent]:
        """The events to apply when replaying from offset_s, joins of instances up then first."""
        up: dict[str, InstanceEvent] = {}
        for ev in self.events:
            if ev.time_s >= offset_s:
                break
            if ev.kind == "join":
                up[ev.instance_id] = ev
            else:
                up.pop(ev.instance_id, None)
        later = [ev for ev in self.events if ev.time_s >= offset_s]
        joined = set(up) | {ev.instance_id for ev in later if ev.kind == "join"}
        now = [dataclasses.replace(ev, time_s=offset_s) for ev in up.values()]
        return now + [ev for ev in later if ev.instance_id in joined]

    def _run(self) -> None:
        try:
            for ev in self._due:
                if self._stop.wait(max(0.0, self._start + ev.time_s - self.clock())):
                    return
                self.apply(ev)
                self.applied += 1
        except BaseException as exc:  # surfaced by the job through .error
            self.error = exc

    def apply(self, ev: InstanceEvent) -> None:
        if ev.kind == "join":
            self.fleet.join(ev.instance_id, "preemptible")
            return
        if ev.kind == "kill" and not ev.sudden:
            # the notice's own deadline ends it; nothing later goes ahead of that
            while not self.fleet.wait_ended(ev.instance_id, timeout_s=1.0):
                if self._stop.is_set():
                    return
            return
        if self.busy_wait_s > 0:
            self.fleet.wait_busy(ev.instance_id, self.busy_wait_s)
        if ev.kind == "notice":
            self.fleet.notice(ev.instance_id, max(0.0, ev.deadline_s - ev.time_s))
        else:
            self.fleet.kill(ev.instance_id)

    def wait(self, timeout: float) -> bool:
        """True once every event has been applied (or the replay stopped)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
