"""The trainer's side of RolloutService: start a step, learn when the reserved instances are
free, take micro-batches, lend the reserved instances back when the rollout needs them,
and end the step cleanly (nothing of it left running on any engine).

The reserved instances belong to one side at a time. From start_step() until
wait_window_closed() returns True they roll out; after that they are the trainer's, and
the controller never routes to them again unless the trainer calls lend_reserved(). If
queued samples can run nowhere else (every preemptible instance lost, or refusing them),
reserved_needed() turns True and a waiting next_microbatch() returns None at once; the
trainer, once it can spare the reserved GPUs, calls lend_reserved() and then
wait_window_closed() again before it trains on them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlboost.controller._parts import ServiceParts
from rlboost.controller.collector import Collector
from rlboost.controller.decisions import StepState
from rlboost.controller.metrics import StepMeter, StepMetrics
from rlboost.controller.offload import StepObservation
from rlboost.controller.records import GroupBatch, PromptGroup
from rlboost.errors import RolloutError


class StepApi(ServiceParts):
    """Mixin of RolloutService: the step lifecycle the trainer drives."""

    def start_step(self, step: int, groups: Sequence[PromptGroup], weight_version: int) -> float:
        """Begin rolling out groups with weights weight_version; returns the planned local window (s).

        Raises ValueError, starting nothing, if a group's prompt + max_new_tokens exceeds the
        max_model_len of every live instance (when they all declare one).
        """
        self._check_loop()
        if self._step is not None:
            raise RolloutError(f"step {self._step.meter.step} is still running: call end_step() first")
        self._check_lengths(groups)
        if weight_version != self.registry.current_version:
            self.registry.set_weight_version(weight_version)
        cfg = self.config
        min_samples = cfg.microbatch_min_samples or (groups[0].num_samples if groups else 1)
        collector = Collector(step, groups, weight_version, microbatch_min_samples=min_samples,
                              microbatch_max_samples=cfg.microbatch_max_samples,
                              max_staleness=cfg.registry.max_staleness)
        meter = StepMeter(step=step, weight_version=weight_version, started_at=self.clock.now())
        self.router.begin_step(collector.sample_ids)
        self._held.clear()
        self._step = StepState(collector, meter)
        meter.planned_window_s = self.policy.plan(self._context(self._step))
        self._wake()
        return meter.planned_window_s

    def _check_lengths(self, groups: Sequence[PromptGroup]) -> None:
        limits = [r.info.max_model_len for r in self.registry.live() if r.instance_id in self._engines]
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
            if self._expired(deadline):
                return False
            await self._wait_change(deadline)

    def reserved_needed(self) -> bool:
        """True while queued samples can run only on the reserved instances the trainer holds."""
        st = self._step
        return st is not None and st.reserved_needed and not st.window_open

    def lend_reserved(self) -> None:
        """The trainer lends the reserved instances back for rollout (it is waiting for
        micro-batches and has moved its state off them). The window reopens
        (StepMetrics.reopened counts it); call wait_window_closed() before training on them."""
        st = self._require_step()
        if st.window_open:
            return
        st.window_open = True
        st.handed_over = st.reserved_needed = st.need_announced = False
        st.meter.reopened += 1
        self._wake()

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
                if self._expired(deadline):
                    return None
                await self._wait_change(deadline)
        finally:
            closed = st.meter.window_closed_at
            if closed is not None:  # the trainer waits only once the window has given it back
                st.meter.trainer_idle_s += max(0.0, self.clock.now() - max(began, closed))

    def _slack(self, st: StepState, mb: GroupBatch) -> None:
        """Record when each group was ready and when the trainer took it (after the window)."""
        if st.meter.window_closed_at is None or not mb.groups:
            return
        t0, col = st.meter.started_at, st.collector
        groups = sorted((col.completed_at[g.group_id] - t0, g.num_tokens) for g in mb.groups)
        st.meter.deliveries.append((self.clock.now() - t0, tuple(groups)))

    async def end_step(self) -> StepMetrics:
        """Finish the step, learn from it, return its metrics. Whatever still runs is aborted
        and every call in flight is settled first, so nothing of this step reaches the next
        one (not even when it reuses group ids)."""
        st = self._require_step()
        st.ending = True
        async with self._tick_lock:  # between ticks: nothing is being placed or moved
            for iid in sorted(self._calls):
                await self._settle(iid)
            await self._abort_leftovers()
            await self._release_held()
            metrics = self._learn(st)
            self.router.begin_step(())
            self._step = None
        return metrics

    async def _abort_leftovers(self) -> None:
        for iid in sorted(self._engines):
            sids = self.router.samples_on(iid)
            if not sids or iid not in self._engines:
                continue
            try:
                await self._guard(self._engines[iid].adapter.abort(list(sids)))
            except Exception as exc:
                self._lose(iid, f"abort() failed: {exc!r}")
                continue
            for sid in sids:
                self.router.unassign(sid)

    async def _release_held(self) -> None:
        by_ticket: dict[int, tuple[str, object, list[int]]] = {}
        for sid, (src, ticket) in self._held.items():
            by_ticket.setdefault(id(ticket), (src, ticket, []))[2].append(sid)
        self._held.clear()
        for src, ticket, sids in by_ticket.values():
            await self._release(src, ticket, sids)

    def _learn(self, st: StepState) -> StepMetrics:
        col, meter = st.collector, st.meter
        metrics = meter.freeze(now=self.clock.now(), samples=len(col.sample_ids), total_tokens=col.tokens,
                               duplicates=col.duplicates, gaps=col.gaps)
        if st.failure is None and col.all_done:
            self.policy.observe(StepObservation(
                window_s=metrics.window_s, num_preemptible=metrics.num_preemptible,
                total_tokens=metrics.total_tokens, step_time_s=metrics.step_time_s,
                trainer_idle_s=metrics.trainer_idle_s, rollout_idle_s=metrics.rollout_idle_s,
                train_busy_s=max(0.0, metrics.step_time_s - metrics.window_s - metrics.trainer_idle_s),
                last_microbatch_tokens=meter.last_microbatch_tokens, deliveries=tuple(meter.deliveries)))
        return metrics

    def _require_step(self) -> StepState:
        if self._step is None:
            raise RolloutError("no step is running: call start_step() first")
        return self._step
