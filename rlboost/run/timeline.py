"""What a run directory says happened when: the run clock mapped onto training steps,
the preemptible instances of each launch over time, preemptions, resumes and restarts.

Plain data read from metrics.jsonl and events.jsonl (the plots draw it, tests check it).
Run directories written before events carried a step, a pool or launch records read too:
a launch is then inferred from an instance that joins while the log still has it up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class StepClock:
    """Run-clock seconds to a position on the step axis: step k spans [k - 1, k] (from its
    start to the end of its metrics record); time between steps (checkpoints, a relaunch)
    sits on the boundary."""

    times_s: tuple[float, ...]
    steps: tuple[float, ...]

    @classmethod
    def from_metrics(cls, metrics: list[dict[str, Any]]) -> StepClock | None:
        """None when the records lack the times (elapsed_s, step_wall_s) to place steps."""
        times, steps = [], []
        for m in sorted(metrics, key=lambda m: m.get("step", 0)):
            if "elapsed_s" not in m or "step" not in m:
                return None
            end = float(m["elapsed_s"])
            start = max(end - float(m.get("step_wall_s", 0.0)), times[-1] if times else 0.0)
            times += [start, max(end, start)]
            steps += [int(m["step"]) - 1, int(m["step"])]
        if not times or times[-1] <= times[0]:
            return None
        return cls(tuple(times), tuple(float(s) for s in steps))

    def step_at(self, t_s: float) -> float:
        return float(np.interp(t_s, self.times_s, self.steps))

    def minutes_at(self, step: float) -> float:
        """Minutes on the run clock at a step position (the end of a step at a whole one)."""
        steps, times = self.steps[:1] + self.steps[1::2], self.times_s[:1] + self.times_s[1::2]
        return float(np.interp(step, steps, times)) / 60.0

    @property
    def last(self) -> float:
        return self.steps[-1]


@dataclass(slots=True)
class Segment:
    """One launch's preemptible instances: from x[i] on, placed[i] were placed (billed:
    starting, serving or draining) and serving[i] of them were active without a notice."""

    x: list[float] = field(default_factory=list)
    placed: list[int] = field(default_factory=list)
    serving: list[int] = field(default_factory=list)
    end_x: float | None = None  # where the launch ended (None: still running at the log's end)


@dataclass(frozen=True, slots=True)
class Mark:
    """A preemption (kind "notice" or "sudden") or a relaunch ("resume", "restart") at x.
    A notice's until_x is where its instance was reclaimed, or its launch ended (None if
    the log ends first). source: who decided a preemption (events' `source`, a cloud by its
    name: trace, aws, gcp, azure, hook, node; "" in logs without it)."""

    kind: str
    x: float
    instance: str | None = None
    until_x: float | None = None
    inferred: bool = False  # a relaunch read from the events of a log without launch records
    source: str = ""


@dataclass(slots=True)
class Timeline:
    """axis is "step" (x in steps, StepClock) or "minutes" (no step times in the metrics)."""

    axis: str
    segments: list[Segment]
    marks: list[Mark]
    clock: StepClock | None

    @property
    def peak_placed(self) -> int:
        return max((c for s in self.segments for c in s.placed), default=0)


def read_timeline(metrics: list[dict[str, Any]], events: list[dict[str, Any]]) -> Timeline:
    clock = StepClock.from_metrics(metrics)

    def x_of(e: dict[str, Any]) -> float:
        t = float(e.get("t", 0.0))
        return clock.step_at(t) if clock is not None else t / 60.0

    end = clock.last if clock is not None else None
    builder = _Builder(end)
    for e in events:
        builder.apply(e, x_of(e))
    return Timeline("step" if clock is not None else "minutes", builder.close(end), builder.marks, clock)


def _source(e: dict[str, Any]) -> str:
    return str(e.get("cloud") or e.get("source") or "")


def _pool(e: dict[str, Any]) -> str:
    pool = e.get("pool")
    if pool:
        return str(pool)
    return "reserved" if str(e.get("instance", "")).startswith("reserved") else "preemptible"


class _Builder:
    """Replays events into per-launch segments and marks."""

    def __init__(self, last_x: float | None) -> None:
        self.last_x = last_x  # where the last step ends (None: unknown)
        self.segments: list[Segment] = []
        self.marks: list[Mark] = []
        self.up: dict[str, str] = {}  # instance -> pool, this launch
        self.serving: set[str] = set()
        self.notices: dict[str, int] = {}  # instance -> index of its open notice mark
        self.ended = False  # the launch is shutting down (a shutdown event came)

    def apply(self, e: dict[str, Any], x: float) -> None:
        kind, iid = e.get("kind"), e.get("instance")
        if kind == "launch":
            self._relaunch(x, e.get("reason", "resume"), inferred=False)
            return
        if iid is None:
            return
        if kind == "join":
            if iid in self.up or self.ended:  # a new launch in a log without launch records
                self._relaunch(x, "resume", inferred=True)
            self.up[iid] = _pool(e)
        elif kind == "active" and iid in self.up and iid not in self.notices:
            self.serving.add(iid)
        elif kind == "notice":
            self.serving.discard(iid)
            self.notices[iid] = len(self.marks)
            self.marks.append(Mark("notice", x, iid, source=_source(e)))
        elif kind in ("gone", "death"):
            self._end(e, x, iid)
        self._point(x)

    def _end(self, e: dict[str, Any], x: float, iid: str) -> None:
        if self._shutdown(e, x, iid):
            self._end_launch(x)
            self.ended = True
            return
        if e.get("kind") == "death":
            self.marks.append(Mark("sudden", x, iid, source=_source(e)))
        if iid in self.notices:  # the notice's grace period ends here
            self._close_notice(iid, x)
        self.up.pop(iid, None)
        self.serving.discard(iid)

    def _shutdown(self, e: dict[str, Any], x: float, iid: str) -> bool:
        """The run ended the instance. Logs without reasons: a departure without notice
        after the last step."""
        if "reason" in e or e.get("kind") != "gone":
            return e.get("reason") == "shutdown"
        return iid not in self.notices and self.last_x is not None and x >= self.last_x

    def _close_notice(self, iid: str, x: float) -> None:
        i = self.notices.pop(iid)
        self.marks[i] = Mark("notice", self.marks[i].x, iid, until_x=x, source=self.marks[i].source)

    def _end_launch(self, x: float) -> None:
        """The launch's line and its grace periods still running end at x."""
        if self.segments and self.segments[-1].end_x is None:
            self.segments[-1].end_x = x
        for iid in list(self.notices):
            self._close_notice(iid, x)

    def _relaunch(self, x: float, reason: str, *, inferred: bool) -> None:
        self._end_launch(x)
        if self.segments and reason in ("resume", "restart"):
            self.marks.append(Mark(reason, x, inferred=inferred))
        self.segments.append(Segment())
        self.up, self.serving, self.notices, self.ended = {}, set(), {}, False
        self._point(x)

    def _point(self, x: float) -> None:
        if self.ended:
            return
        if not self.segments:
            self.segments.append(Segment())
        seg = self.segments[-1]
        placed = sum(1 for p in self.up.values() if p == "preemptible")
        serving = sum(1 for i in self.serving if self.up.get(i) == "preemptible")
        if seg.x and seg.x[-1] == x:  # several events at one position: the last count holds
            seg.placed[-1], seg.serving[-1] = placed, serving
        else:
            seg.x.append(x)
            seg.placed.append(placed)
            seg.serving.append(serving)

    def close(self, end: float | None) -> list[Segment]:
        if self.segments and self.segments[-1].end_x is None:
            last = self.segments[-1]
            self.segments[-1].end_x = max(end, last.x[-1]) if end is not None and last.x else end
        return self.segments
