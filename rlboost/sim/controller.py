"""SimController: the rollout controller's round, simulated, over the controller's own parts.

Each round is the controller's StepRound (controller.round: drains, the window, placement,
steals, the check, over StepDecisions, the Registry, the Router, the window policy, the
LengthModel and the RateModels), exactly as RolloutService.tick runs it; only its Mover is
the simulator's (sim.mover: moves on simulated schedules, a sample's tokens counted, never
materialized), and the trainer's side ends and learns from a step as StepLifecycle does.

With controller.max_staleness N >= 1 steps ahead of the running one are in rollout too (a
lane each: its own collector and router), placed by the controller's schedule
(controller.ahead, through StepRound.place_ahead): spec.lookahead picks free_slots (any free
slot takes the next steps' prompts once the running step's are all placed, up to N steps
ahead, the reserved instances' too while their window is open) or after_rollout (one step
ahead, once the trainer has taken the running step's last micro-batch, on preemptible
instances only). The running step's samples always come first: one that needs a slot takes
it from the latest lane's samples.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Callable

from rlboost.controller.ahead import StepsAhead
from rlboost.controller.clock import Clock
from rlboost.controller.decisions import StepDecisions
from rlboost.controller.estimates import LengthModel
from rlboost.controller.lifecycle import learn
from rlboost.controller.metrics import StepMeter, StepMetrics
from rlboost.controller.offload import WindowPolicy, make_policy
from rlboost.controller.records import InstanceInfo
from rlboost.controller.registry import GONE, Registry
from rlboost.controller.round import StepRound, run_now
from rlboost.controller.router import Router
from rlboost.controller.step import StepState
from rlboost.sim.ablations import without_memory
from rlboost.sim.collector import SimCollector
from rlboost.sim.lags import count_lags
from rlboost.sim.mover import SimMover
from rlboost.sim.nodes import SimNode, SimTable
from rlboost.sim.spec import SimSpec


class _CachedViews(StepDecisions):
    """StepDecisions whose instance views are rebuilt only when the registry or the window has
    changed since the last round (`stamp`), or while an instance drains (its views change
    with time): a simulation asks for them every round, and at hundreds of instances building
    them dominated the round. The views are what StepDecisions builds; nothing else differs."""

    stamp = 0
    _cache = None

    def _views(self, st: StepState):
        key = (self.stamp, st.window_open)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        views = super()._views(st)
        self._cache = None if any(v.time_left_s is not None for v in views) else (key, views)
        return views


class SimController:
    """Instances, the running step (and the lanes ahead of it), one controller round per tick()."""

    def __init__(self, spec: SimSpec, clock: Clock, table: SimTable, *, policy: WindowPolicy | None = None):
        """policy: the window policy (default: controller.window's, as the live controller builds it)."""
        # the ablations' what-ifs (SimSpec.seeding, .migration) are the controller's modes
        self.config = cfg = dataclasses.replace(
            spec.controller, seeding=spec.controller.seeding and spec.seeding,
            migration="recompute" if "recompute" in (spec.migration, spec.controller.migration) else "continue")
        self.spec, self.clock, self.table = spec, clock, table
        self.max_staleness = cfg.max_staleness
        self.registry = Registry(cfg.registry, clock, max_staleness=self.max_staleness)
        self.router = Router(cfg.router)
        self.lengths = LengthModel()
        self.policy = policy if policy is not None else make_policy(cfg.window.policy, cfg.window.selected)
        if not spec.window_memory:
            self.policy = without_memory(self.policy)
        self.decisions = _CachedViews(cfg, clock, table=table, registry=self.registry, router=self.router,
                                      lengths=self.lengths, policy=self.policy)
        self.st: StepState | None = None
        self.failure: BaseException | None = None
        self._lost = False  # an instance was lost since the last check of the step
        self._checked_at = 0.0
        self._round_at = 0.0  # when the last round ran (what it collected survives a loss)
        self.poll_s = spec.round_s or cfg.poll_interval_s
        self.step_no = 0  # the step the trainer is on (its rollout may be over)
        self.ahead = StepsAhead(self.max_staleness, registry=self.registry, table=table, router=cfg.router,
                                lengths=self.lengths, poll_interval_s=cfg.poll_interval_s, schedule=spec.lookahead,
                                last_step=spec.steps)
        self.decisions.ahead = self.ahead
        self.mover = SimMover(self)
        self.round = StepRound(clock, decisions=self.decisions, registry=self.registry, router=self.router,
                               table=table, mover=self.mover, note=lambda out: out, fail=self._fail,
                               wake=self._wake)
        self.make_collector: Callable[[int], SimCollector] | None = None  # set by the simulator
        self.lags: dict[int, Counter] = {}  # step -> trained output tokens by lag (step - version)

    def set_weight_version(self, version: int) -> None:
        self.registry.set_weight_version(version)
        self.decisions.stamp += 1

    # -- instances ---------------------------------------------------------------------------

    def register(self, node: SimNode) -> None:
        info = InstanceInfo(instance_id=node.instance_id, kind=node.kind, capacity=self.spec.rollout.capacity)
        self.registry.register(info)
        self.decisions.stamp += 1
        self.table.register(node, self.clock.now())

    def pulled(self, node: SimNode, version: int) -> None:
        rec = self.registry.get(node.instance_id)
        if rec is not None and rec.state != GONE:
            if self.max_staleness and len(node.schedule):  # in-flight samples go on with the new weights
                self.mover.collect(node, self.clock.now())
                for sid in node.schedule.ids():
                    lane = self.lane_of(sid)
                    if lane is not None:
                        lane[0].collector.version_changed(sid, version)
            self.registry.heartbeat(node.instance_id, version)
            self.decisions.stamp += 1

    def notice(self, instance_id: str, grace_s: float) -> None:
        rec = self.registry.get(instance_id)
        if rec is None or rec.state == GONE:
            return
        self.registry.notice(instance_id, grace_s)
        self.decisions.stamp += 1
        if self.st is not None:
            self.st.meter.preemptions += 1

    def lose(self, instance_id: str, reason: str) -> None:
        """The instance died: its samples resume elsewhere from the tokens the last round
        collected (a live controller polls every engine each round; what came after is lost)."""
        rec = self.registry.get(instance_id)
        if rec is None or rec.state == GONE:
            return
        node, now = self.table.nodes.get(instance_id), self.clock.now()
        polled = self._round_at if now - self._round_at < self.poll_s else math.floor(now / self.poll_s) * self.poll_s
        if node is not None and node.schedule.t < polled:
            self.mover.collect(node, polled)
        sids = self.router.samples_on(instance_id)
        restart = self.config.migration == "recompute"
        if self.st is not None and sids:
            self.mover.take_off(self.st, instance_id, sids, requeue=False, advance=False, restart=restart, lost=True)
        ahead = [(lane, lane.router.samples_on(instance_id)) for lane in self.ahead]
        for lane, lost in ahead:
            if lost:
                self.mover.take_off(lane.st, instance_id, lost, requeue=False, advance=False, router=lane.router,
                                    restart=restart, lost=True)
        self.registry.mark_gone(instance_id, reason)
        self.decisions.stamp += 1
        self._lost = True
        self.router.requeue(sids, failed=True)
        for lane, lost in ahead:
            lane.router.requeue(lost, failed=True)
            lane.st.meter.resumes += len(lost)
        self.table.remove(instance_id)
        if self.st is not None:
            self.st.meter.deaths += 1
            self.st.meter.resumes += len(sids)

    # -- a step --------------------------------------------------------------------------------

    def start_step(self, step: int, collector: SimCollector) -> float:
        """The trainer starts the step: a lane ahead that holds it becomes the running step
        (its samples in flight stay where they are), with the window open from now."""
        self.step_no = step
        lane = self.ahead.promote(step)
        if lane is not None:
            if lane.st.collector is not collector:
                raise ValueError(f"step {step} is already in rollout with another collector")
            self.router = self.decisions.router = self.round.router = lane.router
            self.decisions.stamp += 1
            self.st, meter = lane.st, lane.st.meter
            self.st.router = None  # the controller's router now (the lane's own)
            self.st.join_reserved(self.clock.now())
        else:
            meter = StepMeter(step=step, weight_version=step, started_at=self.clock.now())
            self.router.begin_step(collector.sample_ids)
            self.st = StepState(collector, meter)
        self.failure = None
        meter.planned_window_s = self.policy.plan(self.decisions.context(self.st))
        return meter.planned_window_s

    def lane_collector(self, step: int) -> SimCollector | None:
        """The collector of `step` if it is already in rollout (a lane ahead), else None."""
        lane = self.ahead.first(step)
        return lane.st.collector if lane is not None else None

    def tick(self) -> None:
        """One round: finished samples, then the controller's StepRound (drains, the window,
        placement, the check), then the steps ahead."""
        st, now = self.st, self.clock.now()
        self._round_at = now
        for node in self.table.due(now):
            self.mover.collect(node, now)
        if st is not None and self.table.next_due() < math.inf:  # some engine is decoding
            st.last_progress = now
        run_now(self.round.drain_due(st))
        if st is not None and st.failure is None and not st.ending:
            run_now(self.round.run(st, check=False))
            # the check can fail a step only on losses, refusals, or silence (idle_timeout_s); its
            # other answer, rollout done, only once everything is collected
            quiet = now - self._checked_at >= self.config.idle_timeout_s / 4
            if st.collector.all_done or self.router.queued or self._lost or quiet:
                self._lost, self._checked_at = False, now
                self.round.check(st)
        if self.max_staleness:
            self._ahead_round()

    def _fail(self, exc: BaseException) -> None:
        if self.st is not None and self.st.failure is None:
            self.st.failure = self.failure = exc

    def _wake(self) -> None:
        """The trainer waits on the window: once it closes, the reserved instances are its own."""
        if self.st is not None and not self.st.window_open:
            self.st.handed_over = True

    # -- steps ahead (max_staleness >= 1) -----------------------------------------------------

    def lane_of(self, sid: int) -> tuple[StepState, Router] | None:
        """The step state and router a sample belongs to (None: no step in rollout holds it)."""
        if self.st is not None and sid in self.st.collector:
            return self.st, self.router
        lane = self.ahead.of(sid)
        return (lane.st, lane.router) if lane is not None else None

    def _ahead_round(self) -> None:
        """The controller's schedule of the steps ahead (StepRound.place_ahead); the simulated
        driver opens the next step's lane whenever the schedule allows it."""
        run_now(self.round.place_ahead(self.st, self.ahead, self._open_next))

    def _open_next(self, reserved: bool) -> bool:
        st, ahead = self.st, self.ahead
        taken = st is None or st.collector.all_taken
        if self.make_collector is None or not ahead.may_open(self.step_no, reserved, taken):
            return False
        step = ahead.next_step(self.step_no)
        ahead.open(step, self.make_collector(step), self.clock.now())
        return True

    def trained(self, batch) -> None:
        """The trainer takes a micro-batch of the running step: every token's version must be
        in the step's window (StaleSampleError otherwise); count its tokens by lag."""
        step = self.st.meter.step
        count_lags(self.st.collector, batch, step, self.max_staleness, self.lags.setdefault(step, Counter()))

    # -- the trainer's side --------------------------------------------------------------------

    def lend_reserved(self) -> None:
        if self.st is not None:
            self.st.lend_reserved()

    def end_step(self) -> StepMetrics:
        """Finish the step (everything is collected by then) and let the policy learn from it."""
        st = self.st
        st.ending = True
        metrics = learn(st, self.policy, self.clock.now())
        self.router.begin_step(())
        self.st = None
        return metrics
