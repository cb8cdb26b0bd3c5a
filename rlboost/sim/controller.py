"""SimController: the rollout controller's round, simulated, over the controller's own parts.

The Registry, the Router, StepDecisions (window, dispatch, steal, check), the window policy,
the LengthModel and the RateModels are the ones the real RolloutService runs, unchanged;
only engine calls are replaced by moves on simulated schedules (a sample's tokens are
counted, never materialized), in the order RolloutService.tick makes them.

With controller.max_staleness N >= 1 steps ahead of the running one are in rollout too (a
lane each: its own collector and router), on whatever version an instance holds, if the
rules of controller.staleness let it start that step. When a lane opens is spec.lookahead:
after_rollout (what the controller's StepLifecycle does: the next step starts ahead once
the trainer has taken the running step's last micro-batch, on preemptible instances only)
or free_slots (a what-if: once nothing of the running step waits for a slot, any free slot
takes the next steps' prompts, up to N steps ahead, the reserved instances' too while their
window is open). The running step's samples always come first: one that needs a slot takes
it from the latest lane's samples.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

from rlboost.controller.clock import Clock
from rlboost.controller.continuation import resume_points
from rlboost.controller.decisions import AskForReserved, CloseWindow, FailStep, ReopenWindow, RolloutDone, StepDecisions
from rlboost.controller.estimates import LengthModel
from rlboost.controller.metrics import StepMeter, StepMetrics
from rlboost.controller.offload import StepObservation, make_policy
from rlboost.controller.records import InstanceInfo
from rlboost.controller.registry import GONE, Registry
from rlboost.controller.router import Router
from rlboost.controller.step import StepState
from rlboost.sim.ablations import without_memory
from rlboost.sim.collector import SimCollector
from rlboost.sim.lanes import Lanes, count_lags
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

    def __init__(self, spec: SimSpec, clock: Clock, table: SimTable):
        cfg = spec.controller
        self.spec, self.clock, self.table = spec, clock, table
        self.max_staleness = cfg.max_staleness
        self.registry = Registry(cfg.registry, clock, max_staleness=self.max_staleness)
        self.router = Router(cfg.router)
        self.lengths = LengthModel()
        self.policy = make_policy(cfg.window.policy, cfg.window.selected)
        if not spec.window_memory:
            self.policy = without_memory(self.policy)
        self.decisions = _CachedViews(cfg, clock, table=table, registry=self.registry, router=self.router,
                                      lengths=self.lengths, policy=self.policy)
        self.st: StepState | None = None
        self.failure: BaseException | None = None
        self._lost = False  # an instance was lost since the last check of the step
        self._checked_at = 0.0
        self.step_no = 0  # the step the trainer is on (its rollout may be over)
        self.ahead = Lanes(self.max_staleness, spec.steps, self.registry, table, cfg.router, cfg.poll_interval_s)
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
                self._collect_node(node, self.clock.now())
                for sid in node.schedule.ids():
                    lane = self._lane_of(sid)
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
        """The instance died: its samples resume elsewhere from their last collected tokens."""
        rec = self.registry.get(instance_id)
        if rec is None or rec.state == GONE:
            return
        sids = self.router.samples_on(instance_id)
        restart = self.spec.migration == "recompute"
        if self.st is not None and sids:  # what was collected by the last round survives
            self._take_off(self.st, instance_id, sids, advance=False, restart=restart)
        ahead = [(lane, lane.router.samples_on(instance_id)) for lane in self.ahead]
        for lane, lost in ahead:
            if lost:
                self._take_off(lane.st, instance_id, lost, advance=False, router=lane.router, restart=restart)
        self.registry.mark_gone(instance_id, reason)
        self.decisions.stamp += 1
        self._lost = True
        self.router.release(instance_id, failed=True)
        self.router.requeue(sids, failed=True)
        for lane, lost in ahead:
            lane.router.release(instance_id, failed=True)
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
            self.router = self.decisions.router = lane.router
            self.decisions.stamp += 1
            self.st, meter = lane.st, lane.st.meter
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
        """One round: finished samples, drains, the window, placement, the watchdog."""
        st, now = self.st, self.clock.now()
        for node in self.table.due(now):
            self._collect_node(node, now)
        if st is not None and self.table.next_due() < math.inf:  # some engine is decoding
            st.last_progress = now
        restart = self.spec.migration == "recompute"
        for rec in self.registry.drains_due():
            iid = rec.instance_id
            if st is not None:
                self._take_off(st, iid, self.router.samples_on(iid), restart=restart)
            for lane in self.ahead:
                self._take_off(lane.st, iid, lane.router.samples_on(iid), router=lane.router, restart=restart)
            self.registry.mark_gone(iid, "drained after a preemption notice")
            self.decisions.stamp += 1
            self.table.remove(iid)
        if st is not None and st.failure is None and not st.ending:
            self._round(st, now)
        if self.max_staleness:
            self._ahead_round()

    def _round(self, st: StepState, now: float) -> None:
        """The running step's round: the window, placement, the check."""
        if st.window_open or self.router.queued:  # closed, with nothing queued, it can only say no
            self._window(st)
        self._place(st)
        # the check can fail a step only on losses, refusals, or silence (idle_timeout_s); its
        # other answer, rollout done, only once everything is collected
        quiet = now - self._checked_at >= self.spec.controller.idle_timeout_s / 4
        if not (st.collector.all_done or self.router.queued or self._lost or quiet):
            return
        self._lost, self._checked_at = False, now
        action = self.decisions.check(st)
        if isinstance(action, RolloutDone):
            st.rollout_done(now, action.num_preemptible)
        elif isinstance(action, FailStep):
            st.failure = self.failure = action.error

    def _collect_node(self, node: SimNode, now: float, *, advance: bool = True) -> None:
        """Advance the node's engine to now; collect what finished; measure its rate."""
        sched = node.schedule
        running = sched.running
        for sid in (sched.advance(now) if advance else ()):
            lane = self._lane_of(sid)
            if lane is None:
                sched.drop(sid)
                continue
            st, router = lane
            col = st.collector
            col.finish(sid, now)
            sched.drop(sid)
            router.finish(sid)
            self.lengths.observe(col.length(sid))
            st.meter.add_tokens(node.instance_id, node.kind, col.length(sid) - node.bases.pop(sid, 0))
        if advance:
            self.table.observe(node, now, running)
        self.table.touch(node)

    def _window(self, st: StepState) -> None:
        action = self.decisions.window(st)
        if isinstance(action, CloseWindow):
            st.close_window(self.clock.now(), action.num_preemptible)
            st.handed_over = True  # the trainer waits for it: it takes the reserved instances at once
            for iid in action.evacuate:
                self._take_off(st, iid, self.router.samples_on(iid), restart=not self.spec.seeding)
                for lane in self.ahead:
                    self._take_off(lane.st, iid, lane.router.samples_on(iid), router=lane.router)
        elif isinstance(action, ReopenWindow):
            st.reopen_window()
        elif isinstance(action, AskForReserved):
            st.reserved_needed = True

    def _place(self, st: StepState) -> None:
        for a in self.decisions.dispatch(st):
            self._send(st, a.instance_id, a.sample_ids)
        if self.router.queued:
            return
        for m in self.decisions.steal(st):
            rec = self.registry.get(m.target)
            if rec is None or not self.registry.takes_work(rec):
                continue
            if any(lane.router.samples_on(m.target) for lane in self.ahead):
                continue  # its rate there is shared with later steps' samples the router does not count
            moved = self._take_off(st, m.source, m.sample_ids, requeue=False)
            if moved:
                self._send(st, m.target, moved)

    # -- moving samples ------------------------------------------------------------------------

    def _take_off(self, st: StepState, iid: str, sids, *, requeue: bool = True, advance: bool = True,
                  router: Router | None = None, restart: bool = False) -> list[int]:
        """Take samples off an instance with their progress (trimmed as the continuation says);
        finished ones are collected first; returns the unfinished ones (queued again unless
        told otherwise). Without advance, what the engine made since the last round is lost;
        with restart (the paper's ablations, SimSpec), all of it."""
        router = router or self.router
        node = self.table.nodes.get(iid)
        if node is None or not sids:
            return []
        col = st.collector
        if node.schedule.t < self.clock.now() or not advance:
            self._collect_node(node, self.clock.now(), advance=advance)
        moved: dict[int, int] = {}
        for sid in sids:
            if col.finished(sid) or sid not in node.schedule:
                continue
            moved[sid] = col.lift(sid)
            node.schedule.drop(sid)
            st.meter.add_tokens(iid, node.kind, moved[sid] - node.bases.pop(sid, 0))
        self.table.touch(node)
        for sid, n in moved.items():
            st.meter.moved(n, 0)
            router.unassign(sid)
            if restart and n:
                st.meter.trimmed_tokens += n
                col.lift(sid, 0)
        if requeue:
            router.requeue(list(moved), failed=False)
        return list(moved)

    def _send(self, st: StepState, iid: str, sids, router: Router | None = None) -> None:
        router = router or self.router
        node = self.table.nodes.get(iid)
        rec = self.registry.get(iid)
        if node is None or not node.alive or rec is None or rec.state == GONE:
            router.requeue(sids, failed=False)
            return
        col, sched = st.collector, node.schedule
        if sched.t < self.clock.now():
            self._collect_node(node, self.clock.now())
        if self.ahead:
            self._make_room(iid, len(sched) + len(sids) - rec.info.capacity, st.meter.step)
        mode = self.spec.controller.continuation
        if mode != "token":  # resumed samples restart where the continuation says (SampleMover._trim)
            held = {sid: col.progress(sid) for sid in sids if col.progress(sid) > 0}
            if held:
                keep = resume_points(held, lambda s: col.group_of(s).group_id, mode, col.finished_shortest(held))
                for sid, n in keep.items():
                    if n < held[sid]:
                        st.meter.trimmed_tokens += held[sid] - n
                        col.lift(sid, n)
        for sid in sids:
            router.assign(sid, iid)
            progress = col.progress(sid)
            position = col.prompt_len(sid) + progress
            prefill = sched.pace.prefill_time(float(max(1, position)), 0.0, 1.0)
            sched.admit(sid, prompt_len=col.prompt_len(sid), base=progress, length=col.length(sid), prefill_s=prefill)
            col.place(sid, sched, node.version)
            node.bases[sid] = progress
            if progress:
                st.meter.reprefill_tokens += position
        self.table.touch(node)

    # -- steps ahead (max_staleness >= 1) -----------------------------------------------------

    def _lane_of(self, sid: int) -> tuple[StepState, Router] | None:
        """The step state and router a sample belongs to (None: no step in rollout holds it)."""
        if self.st is not None and sid in self.st.collector:
            return self.st, self.router
        lane = self.ahead.of(sid)
        return (lane.st, lane.router) if lane is not None else None

    def _ahead_round(self) -> None:
        """Free slots take the next steps' prompts once the running step has nothing waiting
        for one (the reserved instances' only while its window is open)."""
        st = self.st
        if st is not None and (self.router.queued or (self.spec.lookahead == "after_rollout"
                                                      and not st.collector.all_taken)):
            return
        reserved = self.spec.lookahead == "free_slots" and st is not None and st.window_open and not st.ending
        held = Counter() if st is None else Counter({iid: len(self.router.samples_on(iid)) for iid in self.table.nodes})
        for i in range(len(self.ahead) + 1):
            if i == len(self.ahead) and (self.make_collector is None or (i and self.spec.lookahead == "after_rollout")
                                         or not self.ahead.open_next(self.step_no, self.make_collector, reserved)):
                return
            lane = self.ahead[i]
            if lane.router.queued:
                col = lane.st.collector
                remaining = (lambda c: lambda sid: self.lengths.expected_remaining(c.progress(sid), c.max_new(sid)))(col)
                budget = (lambda c: lambda sid: c.max_new(sid) - c.progress(sid))(col)
                views = self.ahead.views(lane, held, reserved)
                for a in lane.router.dispatch(views, remaining, col.max_length, budget, col.position):
                    self._send(lane.st, a.instance_id, a.sample_ids, router=lane.router)
                if lane.router.queued:
                    return  # later steps wait until this one's prompts have all started
            for iid in self.table.nodes:
                held[iid] += len(lane.router.samples_on(iid))

    def _make_room(self, iid: str, excess: int, step: int) -> None:
        """Free `excess` slots on the instance for samples of `step`, taking the latest later
        step's samples with the fewest tokens off it (they wait at the front of their queue)."""
        for lane in reversed(self.ahead.items):
            if excess <= 0 or lane.step <= step:
                return
            col = lane.st.collector
            mine = sorted(lane.router.samples_on(iid), key=lambda sid: (col.progress(sid), sid))[:excess]
            if mine:
                excess -= len(self._take_off(lane.st, iid, mine, router=lane.router))

    def trained(self, batch) -> None:
        """The trainer takes a micro-batch of the running step: every token's version must be
        in the step's window (StaleSampleError otherwise); count its tokens by lag."""
        step = self.st.meter.step
        count_lags(self.st.collector, batch, step, self.max_staleness, self.lags.setdefault(step, Counter()))

    # -- the trainer's side --------------------------------------------------------------------

    def lend_reserved(self) -> None:
        st = self.st
        if st is None or st.window_open:
            return
        st.reopen_window()
        st.handed_over = st.reserved_needed = st.need_announced = False

    def end_step(self) -> StepMetrics:
        """Finish the step (everything is collected by then) and let the policy learn from it."""
        st, now = self.st, self.clock.now()
        st.ending = True
        col, meter = st.collector, st.meter
        metrics = meter.freeze(now=now, samples=len(col.sample_ids), total_tokens=col.tokens, duplicates=0, gaps=0)
        if st.failure is None and col.all_done:
            self.policy.observe(StepObservation.measured(metrics, meter))
        self.router.begin_step(())
        self.st = None
        return metrics
