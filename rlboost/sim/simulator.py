"""Simulator: a whole run as a discrete-event simulation, in the run's seconds.

The trainer takes the timing model's time per micro-batch (TrainerTiming), publishes each
version and waits for its reserved engines to hold it; preemptible instances come and go
following the run's availability trace (replayed from the end of the first step, as
`rlboost train` does), start, pull each version over the modelled link, and roll out on
schedules that take the timing model's time; the controller's own parts decide everything
(SimController). Time jumps from event to event: a controller round runs every
poll_interval_s while the local window is open, and otherwise only when something changed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.traces.replay import named_trace, notice_seconds, replay_span, trace_events
from rlboost.controller.clock import ManualClock
from rlboost.controller.metrics import StepMetrics
from rlboost.errors import StepFailed
from rlboost.sim.ablations import victims
from rlboost.sim.collector import SimCollector
from rlboost.sim.controller import SimController
from rlboost.sim.nodes import SimNode, SimNodes, SimTable, WeightLink
from rlboost.sim.spec import SimSpec
from rlboost.sim.workload import as_sim_groups, sim_groups
from rlboost.trainer.emulated import TrainerTiming

RESERVED_CLUSTER = "reserved-cluster"


@dataclass(frozen=True, slots=True)
class SimStep:
    """One simulated step: the controller's metrics, its span in run seconds (start to the next
    step's start, publish and pulls included), preemptible instances up, dollars so far, and
    sequence_tokens: prompt + response of every sample (emulated tokens), what the artifact's
    throughput counts (its metrics.total_tokens are the generated ones)."""

    metrics: StepMetrics
    started_s: float
    wall_s: float
    preemptible_up: int
    cost_usd: float
    reserved_usd: float
    sequence_tokens: int = 0
    staleness: tuple[int, ...] = ()  # trained output tokens at lag 0..max_staleness (emulated tokens)


@dataclass(slots=True)
class SimResult:
    spec: SimSpec
    steps: list[SimStep] = field(default_factory=list)
    preemptions: dict = field(default_factory=lambda: {"notice": 0, "sudden": 0})
    trace_pace: str = ""  # how the availability trace was replayed (replay.replay_span), "" without one
    seconds: float = 0.0  # how long the simulation itself took (host seconds)


class Simulator:
    """Runs spec.steps steps; progress(step_record) is called after each."""

    def __init__(self, spec: SimSpec, *, groups: Callable[[int], list] | None = None):
        """groups(step): the step's PromptGroups (a task feed's, to roll out exactly what an
        emulated run does); by default synthetic groups of spec.prompt_tokens tokens."""
        self.spec = spec
        self.groups = groups
        self.clock = ManualClock()
        self.ledger = CostLedger(spec.cost)
        self.table = SimTable(spec.controller)
        self.nodes = SimNodes(spec, self.table, self.ledger)
        self.ctl = SimController(spec, self.clock, self.table)
        self.ctl.make_collector = self._collector
        self.trainer = TrainerTiming(spec.rollout.emulated, spec.trainer_gpus)
        self.link = WeightLink(spec, self.trainer.payload_bytes(spec.transfer.publisher.egress_bytes_per_s))
        self.poll = spec.round_s or spec.controller.poll_interval_s
        self._events: list = []
        self._seq = itertools.count()
        self.version = 0
        self._dirty = True
        self._sequence_tokens = 0

    # -- events --------------------------------------------------------------------------------

    def at(self, when: float, kind: str, *args) -> None:
        heapq.heappush(self._events, (when, next(self._seq), kind, args))

    def _apply(self, kind: str, args: tuple) -> None:
        self._dirty = True
        now = self.clock.now()
        if kind == "started":
            node = self.table.nodes[args[0]]
            if node.alive:
                self.ctl.register(node)
                self._pull(node)
        elif kind == "pulled":
            node, version = self.table.nodes[args[0]], args[1]
            node.pulling = None
            if node.alive:
                node.version = version
                self.ctl.pulled(node, version)
                if version != self.version:
                    self._pull(node)
        elif kind == "trace":
            self._trace(args[0], now)
        elif kind == "end":  # a noticed instance's deadline
            self.ctl.lose(args[0], "reclaimed at its deadline")
            self.nodes.end(args[0], now)
        elif kind == "preempt":  # spec.preempt: instances killed together, replaced later or not
            self._preempt(*args)
        elif kind == "replace":
            node = self.nodes.place(f"{args[0]}-r", "preemptible", now)
            self.at(self.nodes.starts_at(node), "started", node.instance_id)

    def _trace(self, ev, now: float) -> None:
        iid = ev.instance_id
        if ev.kind == "join":
            node = self.nodes.place(iid, "preemptible", now)
            self.at(self.nodes.starts_at(node), "started", iid)
        elif ev.kind == "notice":
            self.ctl.notice(iid, ev.deadline_s - ev.time_s)
            self.result.preemptions["notice"] += 1
            self.at(now + ev.deadline_s - ev.time_s, "end", iid)
        elif ev.sudden:
            self.ctl.lose(iid, "killed without notice")
            self.nodes.end(iid, now)
            self.result.preemptions["sudden"] += 1

    def _preempt(self, count: int, replace_after: float | None) -> None:
        now = self.clock.now()
        for iid in victims(self.table.nodes.values(), count):
            self.ctl.lose(iid, "killed without notice")
            self.nodes.end(iid, now)
            self.result.preemptions["sudden"] += 1
            if replace_after is not None:
                self.at(now + replace_after / self.spec.time_scale, "replace", iid)

    def _pull(self, node: SimNode) -> None:
        if node.pulling != self.version:
            node.pulling = self.version
            self.at(self.link.pull_done_at(self.clock.now()), "pulled", node.instance_id, self.version)

    # -- time ----------------------------------------------------------------------------------

    def advance_to(self, target: float) -> None:
        """Apply every event and controller round up to target, in time order."""
        while True:
            t_event = self._events[0][0] if self._events else math.inf
            t_tick = self._next_round()
            t = min(t_event, t_tick)
            if t > target:
                self.clock.advance(max(0.0, target - self.clock.now()))
                return
            self.clock.advance(max(0.0, t - self.clock.now()))
            if t_event <= t_tick:
                _, _, kind, args = heapq.heappop(self._events)
                self._apply(kind, args)
            else:
                self._dirty = False
                self.ctl.tick()

    def _next_round(self) -> float:
        """The next controller round that can change anything (rounds fall on a poll_interval_s grid)."""
        now = self.clock.now()
        grid = (math.floor(now / self.poll + 1e-9) + 1) * self.poll
        st = self.ctl.st
        if self._dirty or (st is not None and (st.window_open or self.ctl.router.queued)):
            return grid
        due = self.table.next_due()
        drains = [r.drain_at for r in self.ctl.registry.live() if r.drain_at is not None]
        due = min([due, *drains])
        if due == math.inf:
            return math.inf
        return max(grid, math.ceil(due / self.poll - 1e-9) * self.poll)

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        """Advance round by round until ready() holds."""
        while not ready():
            if self.ctl.failure is not None:
                raise self.ctl.failure
            nxt = min(self._events[0][0] if self._events else math.inf, self._next_round())
            if nxt == math.inf:
                raise StepFailed(f"simulation cannot progress while waiting for {what}", missing=())
            self.advance_to(nxt)

    # -- the run -------------------------------------------------------------------------------

    def run(self, progress: Callable[[SimStep], None] | None = None) -> SimResult:
        t0 = time.perf_counter()
        spec, c = self.spec, self.spec.cluster
        self.result = SimResult(spec)
        self.ledger.start(RESERVED_CLUSTER, "reserved", at_s=0.0)
        for i in range(c.reserved_instances):
            self.at(0.0, "started", self.nodes.place(f"reserved-{i}", "reserved", 0.0).instance_id)
        for i in range(c.initial_preemptible):
            node = self.nodes.place(f"spot-s{i}", "preemptible", 0.0)
            self.at(self.nodes.starts_at(node), "started", node.instance_id)
        self.publish(1)
        for step in range(1, spec.steps + 1):
            started = self.clock.now()
            for at_step, offset, count, replace_after in spec.preempt:
                if at_step == step:
                    self.at(started + offset / spec.time_scale, "preempt", count, replace_after)
            self.wait_until(lambda: all(n.version >= step for n in self.table.nodes.values()
                                        if n.kind == "reserved"), "the reserved engines' weights")
            metrics = self.train_step(step)
            self.publish(step + 1)
            wall = self.clock.now() - started
            if step == 1:
                self._replay_trace(wall)
            cost = self.ledger.summary(at_s=self.clock.now())
            up = sum(1 for n in self.table.nodes.values() if n.kind == "preemptible" and n.alive)
            lags = self.ctl.lags.pop(step, {})
            rec = SimStep(metrics=metrics, started_s=started, wall_s=wall, preemptible_up=up,
                          cost_usd=cost.total_usd, reserved_usd=cost.reserved_usd,
                          sequence_tokens=self._sequence_tokens,
                          staleness=tuple(lags.get(lag, 0) for lag in range(spec.controller.max_staleness + 1)))
            self.result.steps.append(rec)
            if progress is not None:
                progress(rec)
        self.result.seconds = time.perf_counter() - t0
        return self.result

    def publish(self, version: int) -> None:
        """Stage the version (the trainer's publish time), make it current, start every pull."""
        self.advance_to(self.clock.now() + self.trainer.timing.publish_s() / self.trainer.scale)
        self.version = version
        self.ctl.set_weight_version(version)
        for node in self.table.live():
            if node.alive:
                self._pull(node)
        self._dirty = True

    def _replay_trace(self, first_step_s: float) -> None:
        spec, c = self.spec, self.spec.cluster
        trace = named_trace(c.trace, max_count=c.max_preemptible - c.initial_preemptible, seed=c.seed)
        if trace is None:
            return
        fit = max(1.0, first_step_s * max(spec.steps - 1, 1) * c.trace_fraction)
        duration, pace = replay_span(c, trace, fit_s=fit, time_scale=spec.time_scale)
        notice = notice_seconds(c, time_scale=spec.time_scale)
        notices = ("no notices (every preemption sudden)" if c.sudden_fraction >= 1.0 else
                   f"notices {notice * spec.time_scale:g} modelled s, {c.sudden_fraction:.0%} of preemptions without one")
        self.result.trace_pace = f"trace {c.trace} replayed {pace}; {notices}"
        events = trace_events(trace.compressed_to(duration), notice_s=notice, sudden_fraction=c.sudden_fraction,
                              victim_order=c.victim_order, seed=c.seed)
        now = self.clock.now()
        for ev in events:
            if ev.kind == "kill" and not ev.sudden:
                continue  # a notice ends its instance at its own deadline
            self.at(now + ev.time_s, "trace", ev)

    def train_step(self, step: int) -> StepMetrics:
        """Roll out with the reserved engines until the window closes, then train on complete
        groups as they arrive (lending the reserved engines back when only they can finish),
        then spend the step's overhead (the optimizer step among it)."""
        ctl = self.ctl
        col = ctl.lane_collector(step) or self._collector(step)  # already in rollout with max_staleness
        self._sequence_tokens = col.sequence_tokens
        ctl.start_step(step, col)
        self._dirty = True
        st = ctl.st
        self.wait_until(lambda: not st.window_open or col.all_done, "the local window")
        st.handed_over = True
        while True:
            began = self.clock.now()
            self.wait_until(lambda: col.take_ready() or (st.reserved_needed and not st.need_announced),
                            "a micro-batch")
            closed = st.meter.window_closed_at
            if closed is not None:
                st.meter.trainer_idle_s += max(0.0, self.clock.now() - max(began, closed))
            batch = col.take()
            if batch is None:  # only the reserved engines can finish what is queued: lend them
                st.need_announced = True
                ctl.lend_reserved()
                self._dirty = True
                self.wait_until(lambda: not st.window_open or col.all_done, "the local window")
                st.handed_over = True
                continue
            self._delivered(st, batch)
            ctl.trained(batch)
            if ctl.max_staleness:  # a round now: the next step may start ahead once this one is taken
                self._dirty = True
            self.advance_to(self.clock.now() + self.trainer.microbatch_s(batch.lengths) / self.spec.train_speed)
            if batch.last:
                st.meter.last_microbatch_tokens = batch.num_tokens
                break
        self.advance_to(self.clock.now() + self.trainer.timing.step_overhead_s() / self.trainer.scale)
        return ctl.end_step()

    def _collector(self, step: int) -> SimCollector:
        """The step's samples: the task feed's groups, or synthetic ones."""
        spec = self.spec
        if self.groups is not None:
            groups = as_sim_groups(self.groups(step), spec.rollout.emulated)
        else:
            groups = sim_groups(step, num_groups=spec.groups_per_step, group_size=spec.group_size,
                                prompt_len=spec.prompt_tokens, max_new_tokens=spec.max_new_tokens,
                                engine=spec.rollout.emulated, seed=spec.seed)
        return SimCollector(groups, min_samples=spec.microbatch_min_samples,
                            max_samples=spec.controller.microbatch_max_samples)

    def _delivered(self, st, batch) -> None:
        """Record when each group was ready and when the trainer took it (the policy's slack)."""
        col = st.collector
        st.record_delivery(self.clock.now(), [(col.completed_at[g], tokens) for g, tokens in batch.groups])
