"""Replaying an availability trace on a live fleet: the trace (bundled sample, synthetic,
or a file) is capped to the fleet's size, compressed to the run's length and turned into
join / notice / kill events, which a thread applies at their times, in order: no instance
joins before the ones the trace has ended by then are gone, so the fleet never holds more
instances than the trace (and its cap) allows.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rlboost.cluster.traces.availability import AvailabilityTrace
from rlboost.cluster.traces.preemptions import InstanceEvent, PreemptionPolicy, preemption_events
from rlboost.cluster.traces.readers import MEASURED, SAMPLES, load_trace, sample_trace
from rlboost.cluster.traces.synthetic import SyntheticTraceConfig, synthetic_trace

if TYPE_CHECKING:  # the fleet imports Ray, which a simulation that only reads traces never needs
    from rlboost.cluster.fleet import Fleet


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


# Preemption notices by cloud: AWS spot gives two minutes, GCP spot VMs 30 s, Azure spot VMs
# 30 s (anchors, section C; Azure's Scheduled Events announce an eviction at least 30 s ahead).
CLOUD_NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
DEFAULT_NOTICE_S = 8.0  # run seconds, for a trace of no known cloud and injected notices
_CLOUD = re.compile(r"(?<![a-z])(aws|gcp|azure)(?![a-z])")


def trace_cloud(name: str) -> str | None:
    """The cloud a trace was measured on, where it says: a SkyPilot JSON's metadata (`cloud`,
    or its `source`), else the file's name (aws, gcp or azure as a word). None: unknown."""
    if name in ("none", "synthetic"):
        return None
    path = Path(SAMPLES.get(name, name))
    texts = []
    if path.suffix == ".json" and path.is_file() and path.stat().st_size < (64 << 20):
        try:
            meta = json.loads(path.read_text()).get("metadata", {})
            texts += [str(meta.get("cloud", "")), str(meta.get("source", ""))]
        except (OSError, ValueError, AttributeError):
            pass  # unreadable here: the reader says why when the trace is loaded
    texts.append(path.name)
    for text in texts:
        if m := _CLOUD.search(text.lower()):
            return m.group(1)
    return None


def notice_seconds(c, *, time_scale: float = 1.0) -> float:
    """A noticed preemption's warning in run seconds: cluster.notice_s when set, else the
    trace's cloud's (modelled seconds over time_scale), else DEFAULT_NOTICE_S."""
    if c.notice_s is not None:
        return c.notice_s
    cloud = trace_cloud(c.trace)
    return CLOUD_NOTICE_S[cloud] / time_scale if cloud else DEFAULT_NOTICE_S


def own_pace(name: str) -> bool:
    """Whether a trace replays at its own pace by default: a file or a measured bundled trace
    (its seconds are the cluster's); the synthetic samples are compressed into the run."""
    return name not in ("none", "synthetic") and (name in MEASURED or name not in SAMPLES)


def replay_span(c, trace: AvailabilityTrace, *, fit_s: float, time_scale: float = 1.0) -> tuple[float, str]:
    """Run seconds the trace is replayed over, and the pace in words: cluster.trace_duration_s
    when set; a file or measured trace at its own pace (one trace second per modelled second,
    so trace seconds over time_scale); a synthetic sample compressed into fit_s."""
    if c.trace_duration_s:
        return c.trace_duration_s, (f"compressed to {c.trace_duration_s * time_scale:,.0f} modelled s "
                                    f"(cluster.trace_duration_s; the trace lasts {trace.duration_s:,.0f} s)")
    if own_pace(c.trace):
        return trace.duration_s / time_scale, f"at its own pace ({trace.duration_s:,.0f} s)"
    return fit_s, (f"compressed to {fit_s * time_scale:,.0f} modelled s (cluster.trace_fraction "
                   f"{c.trace_fraction:g} of the run; the trace lasts {trace.duration_s:,.0f} s)")


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
        if self.busy_wait_s > 0 and not self._stop.is_set():  # a run that ends meanwhile ends the wait
            self.fleet.wait_busy(ev.instance_id, self.busy_wait_s)
        if self._stop.is_set():
            return
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
        if self.busy_wait_s > 0:
            self.fleet.stop_waits()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
