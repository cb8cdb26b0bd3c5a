"""StepLifecycle: the trainer's side of the controller. Start a step, learn when the
reserved instances are free, take micro-batches, lend the reserved instances back when the
rollout needs them, and end the step cleanly (nothing of it left running on any engine).

The reserved instances belong to one side at a time. From start_step() until
wait_window_closed() returns True they roll out; after that they are the trainer's, and
the controller never routes to them again unless the trainer calls lend_reserved(). If
queued samples can run nowhere else (every preemptible instance lost, or refusing them),
reserved_needed() turns True and a waiting next_microbatch() returns None at once; the
trainer, once it can spare the reserved GPUs, calls lend_reserved() and then
wait_window_closed() again before it trains on them.

With bounded staleness (controller.max_staleness N >= 1) the driver keeps up to N later
steps in flight: start_step(k+j, groups, k+j, ahead=True) while step k runs opens a lane
(controller.ahead) whose prompts take free slots, on the version each engine holds, once
every earlier step's prompts are placed. When step k ends (as soon as the trainer has taken
its last micro-batch) the first lane becomes the running step, its samples staying where
they run; the trainer publishes k+1 and makes it current (set_weight_version), then, once
the reserved instances hold it, calls join_reserved(): the step goes on as if it started
then, its local window sized by what is left to generate. A step started ahead with no step
running (the driver's older use) runs at once on preemptible instances.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rlboost.controller.ahead import StepsAhead
from rlboost.controller.clock import Clock
from rlboost.controller.collector import Collector
from rlboost.controller.config import ControllerConfig
from rlboost.controller.decisions import StepDecisions
from rlboost.controller.engines import EngineTable
from rlboost.controller.estimates import LengthModel
from rlboost.controller.metrics import StepMeter, StepMetrics
from rlboost.controller.mover import SampleMover
from rlboost.controller.offload import StepObservation, WindowPolicy
from rlboost.controller.records import GroupBatch, PromptGroup
from rlboost.controller.registry import Registry
from rlboost.controller.router import Router
from rlboost.controller.step import Outcome, StepState
from rlboost.controller.wakeup import ChangeSignal
from rlboost.errors import RolloutError


class StepLifecycle:
    """Owns the running step (current): the trainer's calls on it, and what it learns from
    moves (lengths of finished samples, lost instances) and from its end (the offload policy).
    The loop runs each tick under tick_lock; end_step() takes it too, so it runs between ticks."""

    def __init__(self, config: ControllerConfig, clock: Clock, *, registry: Registry, router: Router,
                 table: EngineTable, mover: SampleMover, decisions: StepDecisions, lengths: LengthModel,
                 policy: WindowPolicy, signal: ChangeSignal):
        self.config, self.clock, self.registry, self.router = config, clock, registry, router
        self.table, self.mover, self.decisions = table, mover, decisions
        self.lengths, self.policy, self.signal = lengths, policy, signal
        self.tick_lock = asyncio.Lock()  # held by each tick of the loop, and by end_step() between ticks
        self.current: StepState | None = None
        self.ahead: StepsAhead | None = None  # bounded staleness: the steps started ahead of the running one
        self.episodes = False  # samples are multi-turn episodes (RolloutService.attach_environments)

    def note(self, out: Outcome) -> Outcome:
        """Learn from a move: finished samples' lengths; each lost instance counts as a death
        (its samples as resumes, from their prompt with config.migration="recompute", the
        steps ahead's as the running step's) and wakes the trainer's waiting calls."""
        st = self.current
        for sid in out.finished:
            self.lengths.observe(st.collector.progress(sid))
        if out.lost and st is not None:
            for loss in out.lost:
                st.meter.deaths += 1
                st.meter.resumes += len(loss.samples)
                for owner, sids in ((st, loss.samples), *loss.ahead):
                    col = owner.collector
                    owner.meter.displace(s for s in sids if col.knows(s) and not col.finished(s))
                    if self.config.migration == "recompute":  # they restart from their prompt
                        self.mover.restart(owner, sids)
            self.signal.wake()
        return out

    def fail(self, exc: BaseException) -> None:
        st = self.current
        if st is not None and st.failure is None:
            st.failure = exc
            self.signal.wake()

    def start_step(self, step: int, groups: Sequence[PromptGroup], weight_version: int,
                   ahead: bool = False) -> float:
        """Begin rolling out groups with weights weight_version; returns the planned local window (s).

        ahead (max_staleness >= 1): weight_version is not published yet (it is at most
        max_staleness past the current one); only preemptible instances roll out, on the
        version they hold, until join_reserved(); returns 0.0 (the window is planned then).
        While a step runs, a step started ahead waits in a lane (controller.ahead) whose
        prompts take free slots once every earlier step's are placed, and becomes the running
        step when the one before it ends.
        Raises ValueError, starting nothing, if a group's prompt + max_new_tokens exceeds the
        max_model_len of every live instance (when they all declare one).
        """
        self.signal.check()
        lanes = self.ahead is not None and len(self.ahead) > 0
        if (self.current is not None or lanes) and not ahead:
            running = self.current.meter.step if self.current is not None else self.ahead[0].step
            raise RolloutError(f"step {running} is still running: call end_step() first")
        self._check_lengths(groups)
        if ahead:
            if not self.config.max_staleness:
                raise RolloutError("a step starts ahead only with controller.max_staleness >= 1")
            if self.current is not None or lanes:  # the running step's window keeps the instances it needs
                self._check_ahead(weight_version)
            else:
                self.registry.set_step_version(weight_version)
        elif weight_version != self.registry.current_version:
            self.registry.set_weight_version(weight_version)
        collector = self._collector(step, groups, weight_version)
        if self.current is not None or lanes:
            self.ahead.open(step, collector, self.clock.now(), weight_version=weight_version)
            self.signal.wake()
            return 0.0
        meter = StepMeter(step=step, weight_version=weight_version, started_at=self.clock.now())
        self.router.begin_step(collector.sample_ids)
        self.table.forget_held()
        self.current = StepState(collector, meter)
        if ahead:
            self.current.start_ahead()
        else:
            meter.planned_window_s = self.policy.plan(self.decisions.context(self.current))
        self.signal.wake()
        return meter.planned_window_s

    def _check_ahead(self, version: int) -> None:
        current, n = self.registry.current_version, self.config.max_staleness
        if not current <= version <= current + n:
            raise ValueError(f"a step at version {version} cannot start while version {current} is current "
                             f"(max_staleness={n})")
        if self.ahead and version != self.ahead[-1].st.collector.weight_version + 1:
            raise ValueError(f"a step at version {version} cannot follow the steps ahead at versions "
                             f"{[lane.st.collector.weight_version for lane in self.ahead]}")

    def _collector(self, step: int, groups: Sequence[PromptGroup], weight_version: int) -> Collector:
        cfg = self.config
        min_samples = cfg.microbatch_min_samples or (groups[0].num_samples if groups else 1)
        return Collector(step, groups, weight_version, microbatch_min_samples=min_samples,
                         microbatch_max_samples=cfg.microbatch_max_samples, max_staleness=cfg.max_staleness,
                         episodes=self.episodes)

    def set_weight_version(self, version: int) -> None:
        """Make a published version current. Between steps always; during one only with
        bounded staleness, and never past the running step's own version."""
        st = self.current
        if st is not None and (not self.config.max_staleness or version > st.collector.weight_version):
            raise RolloutError("end the running step before making a new weight version current")
        self.registry.set_weight_version(version)
        self.signal.wake()

    def join_reserved(self) -> float:
        """The reserved instances hold the step's version: a step started ahead opens its
        local window now; returns the planned window (s)."""
        st = self._require_step()
        if not st.ahead:
            raise RolloutError(f"step {st.meter.step} did not start ahead: its reserved instances have joined")
        if self.registry.current_version != st.collector.weight_version:
            raise RolloutError(f"step {st.meter.step} trains version {st.collector.weight_version}; publish it "
                               f"(set_weight_version) before the reserved instances join")
        st.join_reserved(self.clock.now())
        st.meter.planned_window_s = self.policy.plan(self.decisions.context(st))
        self.signal.wake()
        return st.meter.planned_window_s

    def _check_lengths(self, groups: Sequence[PromptGroup]) -> None:
        limits = [r.info.max_model_len for r in self.registry.live() if r.instance_id in self.table]
        if not limits or None in limits:
            return  # an instance without a declared limit may take anything; its submit decides
        too_long = [(g.group_id, len(g.prompt_ids) + g.params.max_new_tokens) for g in groups
                    if len(g.prompt_ids) + g.params.max_new_tokens > max(limits)]
        if too_long:
            raise ValueError(f"groups (group_id, prompt + max_new_tokens) {too_long[:5]} exceed the longest "
                             f"max_model_len of the live instances ({max(limits)}): no instance could run them")

    async def wait_window_closed(self, timeout_s: float) -> bool:
        """Wait until the reserved instances are released (window closed or all samples done).
        Once this returns True they are the trainer's until it calls lend_reserved()."""
        st = self._require_step()
        deadline = self.clock.now() + timeout_s
        while True:
            if st.failure is not None:
                raise st.failure
            if not st.window_open or st.collector.all_done:
                st.handed_over = True
                return True
            if self.signal.expired(deadline):
                return False
            await self.signal.wait(deadline)

    def reserved_needed(self) -> bool:
        """True while queued samples can run only on the reserved instances the trainer holds."""
        st = self.current
        return st is not None and st.reserved_needed and not st.window_open

    def lend_reserved(self) -> None:
        """The trainer lends the reserved instances back for rollout (it is waiting for
        micro-batches and has moved its state off them). The window reopens
        (StepMetrics.reopened counts it); call wait_window_closed() before training on them."""
        if self._require_step().lend_reserved():
            self.signal.wake()

    async def next_microbatch(self, timeout_s: float) -> GroupBatch | None:
        """Complete groups for the trainer, or None if none are ready within timeout_s (or at
        once, the first time reserved_needed() turns True while it waits).

        Raises StepFailed (naming the missing samples) if the step cannot complete.
        """
        st = self._require_step()
        if st.delivered_last:
            raise RolloutError(f"step {st.meter.step} has delivered its last micro-batch")
        deadline = self.clock.now() + timeout_s
        began = self.clock.now()
        try:
            while True:
                if st.failure is not None:
                    raise st.failure
                mb = st.collector.take()
                if mb is not None:
                    self._slack(st, mb)
                    if mb.last:
                        st.delivered_last = True
                        st.meter.last_microbatch_tokens = mb.num_tokens
                    return mb
                if self.reserved_needed() and not st.need_announced:
                    st.need_announced = True
                    return None
                if self.signal.expired(deadline):
                    return None
                await self.signal.wait(deadline)
        finally:
            closed = st.meter.window_closed_at
            if closed is not None:  # the trainer waits only once the window has given it back
                st.meter.trainer_idle_s += max(0.0, self.clock.now() - max(began, closed))

    def _slack(self, st: StepState, mb: GroupBatch) -> None:
        """Record when each group was ready and when the trainer took it (the policy's slack)."""
        col = st.collector
        st.record_delivery(self.clock.now(), [(col.completed_at[g.group_id], g.num_tokens) for g in mb.groups])

    async def end_step(self) -> StepMetrics:
        """Finish the step, learn from it, return its metrics. Whatever still runs is aborted
        and every call in flight is settled first, so nothing of this step reaches the next
        one (not even when it reuses group ids)."""
        st = self._require_step()
        st.ending = True
        async with self.tick_lock:  # between ticks: nothing is being placed or moved
            self.note(await self.mover.quiesce(st))
            metrics = self._learn(st)
            self.router.begin_step(())
            self.current = None
            self._promote()
        return metrics

    def _promote(self) -> None:
        """The first step ahead, if any, becomes the running step (still ahead: its reserved
        instances join once they hold its version); its samples stay where they run."""
        if not self.ahead:
            return
        lane = self.ahead.promote(self.ahead[0].step)
        self.registry.set_step_version(lane.st.collector.weight_version)
        self.router.take_over(lane.router)
        lane.st.router = None
        self.current = lane.st
        self.signal.wake()

    def _learn(self, st: StepState) -> StepMetrics:
        return learn(st, self.policy, self.clock.now())

    def _require_step(self) -> StepState:
        if self.current is None:
            raise RolloutError("no step is running: call start_step() first")
        return self.current


def learn(st: StepState, policy: WindowPolicy, now: float) -> StepMetrics:
    """The ended step's metrics; the offload policy learns from a step that completed."""
    col, meter = st.collector, st.meter
    metrics = meter.freeze(now=now, samples=len(col.sample_ids), total_tokens=col.tokens,
                           duplicates=col.duplicates, gaps=col.gaps)
    if st.failure is None and col.all_done:
        policy.observe(StepObservation.measured(metrics, meter))
    return metrics
