"""TraceCapacity: preemptible instances as a replayed availability trace says (replay.py),
compressed to the run's length at the pace of its first step; a resumed run goes on from
where its checkpoint left the trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.traces.replay import TraceReplay, named_trace, notice_seconds, replay_span, trace_events


@dataclass(frozen=True, slots=True)
class TracePlan:
    """The preemptible capacity of a run: the events to replay over duration_s seconds."""

    events: tuple
    duration_s: float
    pace: str = ""


def plan_trace(c: ClusterConfig, steps: int, step_s: float, duration_s: float | None = None,
               time_scale: float = 1.0) -> TracePlan:
    """The trace's events over the run (replay.replay_span: cluster.trace_duration_s, a file or
    measured trace at its own pace, a synthetic one in trace_fraction of `steps` steps of
    step_s seconds); duration_s, the plan of the launch a run resumes, fixes its length."""
    fit = max(1.0, step_s * max(steps, 1) * c.trace_fraction)
    # instances that join at the start count against the cap the trace must stay under
    trace = named_trace(c.trace, max_count=c.max_preemptible - c.initial_preemptible, seed=c.seed)
    if trace is None:
        return TracePlan((), duration_s or c.trace_duration_s or fit)
    duration, pace = replay_span(c, trace, fit_s=fit, time_scale=time_scale)
    duration = duration_s or duration
    events = trace_events(trace.compressed_to(duration), notice_s=notice_seconds(c, time_scale=time_scale),
                          sudden_fraction=c.sudden_fraction, victim_order=c.victim_order, seed=c.seed)
    return TracePlan(events, duration, pace)


class TraceCapacity:
    name = "trace"

    def __init__(self, config: ClusterConfig, fleet: Any, *, time_scale: float = 1.0, **_: Any):
        self.config, self.fleet, self.time_scale = config, fleet, time_scale
        self.replay: TraceReplay | None = None
        self.plan: TracePlan | None = None

    def start(self, resume: dict | None = None) -> None:
        if resume:  # resumed: the trace goes on from where the checkpoint left it
            self._replay(plan_trace(self.config, 0, 0.0, duration_s=resume["duration_s"],
                                    time_scale=self.time_scale), resume["offset_s"])

    def after_step(self, step: int, step_s: float, steps_left: int) -> None:
        if self.replay is None:  # paced by the first step, so it fits the run
            self._replay(plan_trace(self.config, steps_left, step_s, time_scale=self.time_scale))

    def _replay(self, plan: TracePlan, offset_s: float = 0.0) -> None:
        self.plan = plan
        self.replay = TraceReplay(self.fleet, plan.events, busy_wait_s=self.config.preempt_busy_wait_s).start(offset_s)

    def check(self) -> None:
        if self.replay is not None and self.replay.error is not None:
            raise RuntimeError(f"the trace replay failed: {self.replay.error!r}") from self.replay.error

    def position(self) -> dict | None:
        if self.replay is None or self.plan is None:
            return None
        return {"duration_s": self.plan.duration_s, "offset_s": self.replay.position_s}

    def stop(self) -> None:
        if self.replay is not None:
            self.replay.stop()
