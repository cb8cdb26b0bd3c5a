"""How RolloutService decides each tick: close the local window (or ask for the reserved
instances back), place queued samples, steal work for idle slots, and fail a step that
cannot finish.

The policies (offload window, router) only answer questions; this mixin asks them with the
service's current measurements and carries out their answers through EngineMoves.
"""

from __future__ import annotations

from rlboost.controller._parts import ServiceParts
from rlboost.controller.collector import Collector
from rlboost.controller.metrics import StepMeter
from rlboost.controller.offload import WindowContext
from rlboost.controller.registry import ACTIVE, DRAINING
from rlboost.controller.router import InstanceView
from rlboost.errors import StepFailed


class StepState:
    """The running step: its samples' tokens, its tallies, and who holds the reserved instances.

    window_open: the controller may route to the reserved instances. handed_over: the
    trainer has been told (wait_window_closed returned True) that they are its own; from
    then on only lend_reserved() gives them back. reserved_needed: queued samples can run
    nowhere else, so the controller asks for them (next_microbatch returns early once).
    """

    __slots__ = ("collector", "meter", "window_open", "handed_over", "reserved_needed", "need_announced",
                 "failure", "last_progress", "delivered_last", "ending")

    def __init__(self, collector: Collector, meter: StepMeter):
        self.collector, self.meter = collector, meter
        self.window_open = True
        self.handed_over = False
        self.reserved_needed = False
        self.need_announced = False
        self.failure: BaseException | None = None
        self.last_progress = meter.started_at
        self.delivered_last = False
        self.ending = False  # end_step() has begun: nothing new is placed


class StepDecisions(ServiceParts):
    """Mixin of RolloutService: the per-tick decisions of a running step."""

    def _remaining(self, sid: int) -> float:
        col = self._step.collector
        return self.lengths.expected_remaining(col.progress(sid), col.max_new(sid))

    def _context(self, st: StepState) -> WindowContext:
        def rate(kind: str) -> float:
            return sum(self._engines[r.instance_id].rates.full_rate(r.info.capacity)
                       for r in self.registry.routable(kind) if r.instance_id in self._engines)
        col = st.collector
        missing = col.missing()
        remaining = self.lengths.expected_remaining_total([col.progress(s) for s in missing],
                                                          [col.max_new(s) for s in missing])
        return WindowContext(
            elapsed_s=self.clock.now() - st.meter.started_at, generated_tokens=col.tokens,
            remaining_tokens=remaining,
            local_tokens_per_s=rate("reserved"), remote_tokens_per_s=rate("preemptible"),
            num_preemptible=len(self.registry.routable("preemptible")))

    async def _window(self, st: StepState) -> None:
        """Close the local window when the policy says so. When queued samples can run only on
        the reserved instances: reopen it, or, once the trainer holds them, ask for them."""
        remote = [r for r in self.registry.routable("preemptible") if r.instance_id in self._engines]
        if st.window_open:
            if st.collector.all_done:
                return
            if remote and self.policy.should_close(self._context(st)) and not self._reserved_only(st, remote):
                st.window_open = False
                if st.meter.window_closed_at is None:
                    st.meter.window_closed_at = self.clock.now()
                    st.meter.num_preemptible = len(remote)
                for rec in self.registry.live():
                    if rec.kind == "reserved" and rec.instance_id in self._engines:
                        await self._evacuate(rec.instance_id)
                self._wake()
        elif self._needs_reserved(st, remote):
            if not st.handed_over:  # the trainer was not told they are free: take them back
                st.window_open = True
                st.meter.reopened += 1
            elif not st.reserved_needed:
                st.reserved_needed = True
                self._wake()

    def _needs_reserved(self, st: StepState, remote) -> bool:
        """Some queued sample can run on no preemptible instance (none left, or all refuse it)."""
        return self._reserved_only(st, remote, self.router.queued)

    def _reserved_only(self, st: StepState, remote, sids=None) -> bool:
        """Whether any of sids (default: every unfinished sample) can run on no preemptible
        instance: closing the window would strand it."""
        sids = st.collector.missing() if sids is None else sids
        if not sids:
            return False
        views = [self._view(r, accepts=True) for r in remote]
        length = st.collector.max_length
        return any(not any(self.router.can_run(sid, v, length) for v in views) for sid in sids)

    def _view(self, rec, *, accepts: bool, time_left_s: float | None = None) -> InstanceView:
        return InstanceView(rec.instance_id, rec.info.capacity, self._engines[rec.instance_id].rates, accepts,
                            rec.info.max_model_len, time_left_s)

    def _views(self, st: StepState) -> list[InstanceView]:
        """Instances that hold or may take samples. A draining one takes only samples that fit
        before its drain time, less one poll interval (its last tokens must be collected by
        then), and only once its rate has been measured rather than assumed."""
        views = []
        for rec in self.registry.live():
            if rec.instance_id not in self._engines or rec.state not in (ACTIVE, DRAINING):
                continue
            if rec.kind == "reserved" and not st.window_open:
                continue
            accepts, left = self.registry.takes_work(rec), self.registry.time_left_s(rec)
            if left is not None:
                accepts = accepts and self._engines[rec.instance_id].rates.observed
                left -= self.config.poll_interval_s
            views.append(self._view(rec, accepts=accepts, time_left_s=left))
        return views

    def _budget(self, sid: int) -> int:
        """The most tokens the sample may still produce (what a deadline must allow for)."""
        col = self._step.collector
        return col.max_new(sid) - col.progress(sid)

    async def _place(self, st: StepState) -> None:
        col = st.collector
        for a in self.router.dispatch(self._views(st), self._remaining, col.max_length, self._budget, col.position):
            await self._send(a.instance_id, a.sample_ids)
        if self.router.queued:
            return
        for m in self.router.steal(self._views(st), self._remaining, col.position, col.max_length, self._budget):
            if not self.registry.takes_work(self.registry.get(m.target)):
                continue  # lost (or past its drain time) while earlier moves ran
            moved = await self._take_back(m.source, m.sample_ids)
            if moved:
                await self._send(m.target, moved)

    def _check(self, st: StepState) -> None:
        col, now = st.collector, self.clock.now()
        if col.all_done:
            if st.meter.rollout_done_at is None:
                st.meter.rollout_done_at = now
                if st.meter.window_closed_at is None:
                    st.meter.num_preemptible = len(self.registry.routable("preemptible"))
            return
        exhausted = self.router.exhausted()
        stranded = self._stranded(st)
        if exhausted:
            self._fail(StepFailed(
                f"step {st.meter.step}: samples {list(exhausted)} lost their instance more than "
                f"retry_budget={self.config.router.retry_budget} times", missing=col.missing()))
        elif stranded:
            why = "; ".join(f"sample {sid}: " + ", ".join(f"{i} refused it ({r})" for i, r in sorted(
                self.router.refusals(sid).items())) for sid in stranded[:5])
            self._fail(StepFailed(f"step {st.meter.step}: no instance will run samples {stranded[:20]}: {why}",
                                  missing=col.missing()))
        elif now - st.last_progress > self.config.idle_timeout_s:
            missing = col.missing()
            hint = (" (the reserved instances are needed back: call lend_reserved())"
                    if st.reserved_needed else "")
            self._fail(StepFailed(
                f"step {st.meter.step}: no token arrived for {now - st.last_progress:.1f} s "
                f"(idle_timeout_s={self.config.idle_timeout_s}){hint}; {len(missing)} samples unfinished: "
                f"{list(missing[:20])}{' ...' if len(missing) > 20 else ''}", missing=missing))

    def _stranded(self, st: StepState) -> list[int]:
        """Queued samples that every live instance has refused (or cannot fit)."""
        candidates = [self._view(r, accepts=True) for r in self.registry.live()
                      if r.instance_id in self._engines and r.state != DRAINING]
        if not candidates:
            return []
        length = st.collector.max_length
        return [sid for sid in self.router.queued if self.router.refusals(sid)
                and not any(self.router.can_run(sid, v, length) for v in candidates)]
