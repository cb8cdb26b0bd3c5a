"""How RolloutService decides each tick: close or reopen the local window, place queued
samples, steal work for idle slots, and fail a step that cannot finish.

The policies (offload window, router) only answer questions; this mixin asks them with the
service's current measurements and carries out their answers through EngineMoves.
"""

from __future__ import annotations

from rlboost.controller.collector import Collector
from rlboost.controller.metrics import StepMeter
from rlboost.controller.offload import WindowContext
from rlboost.controller.registry import ACTIVE, DRAINING
from rlboost.controller.router import InstanceView
from rlboost.errors import StepFailed


class StepState:
    """The running step: its samples' tokens, its tallies, and where the window stands."""

    __slots__ = ("collector", "meter", "window_open", "failure", "last_progress", "delivered_last")

    def __init__(self, collector: Collector, meter: StepMeter):
        self.collector, self.meter = collector, meter
        self.window_open = True
        self.failure: BaseException | None = None
        self.last_progress = meter.started_at
        self.delivered_last = False


class StepDecisions:
    """Mixin of RolloutService (it relies on the service's registry, router, policy and engines)."""

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
        """Close the local window when the policy says so; reopen it if nothing else can serve."""
        remote = [r for r in self.registry.routable("preemptible") if r.instance_id in self._engines]
        if st.window_open:
            if st.collector.all_done:
                return
            if remote and self.policy.should_close(self._context(st)):
                st.window_open = False
                if st.meter.window_closed_at is None:
                    st.meter.window_closed_at = self.clock.now()
                    st.meter.num_preemptible = len(remote)
                for rec in self.registry.live():
                    if rec.kind == "reserved" and rec.instance_id in self._engines:
                        await self._evacuate(rec.instance_id)
        elif not remote and self.router.queued:
            # no preemptible instance can take the queued samples: the reserved ones must,
            # or the step would never finish
            st.window_open = True
            st.meter.reopened += 1

    def _views(self, st: StepState) -> list[InstanceView]:
        views = []
        for rec in self.registry.live():
            if rec.instance_id not in self._engines or rec.state not in (ACTIVE, DRAINING):
                continue
            if rec.kind == "reserved" and not st.window_open:
                continue
            accepts = rec.state == ACTIVE and self.registry.version_ok(rec.weight_version)
            views.append(InstanceView(rec.instance_id, rec.info.capacity,
                                      self._engines[rec.instance_id].rates, accepts))
        return views

    async def _place(self, st: StepState) -> None:
        views = self._views(st)
        for a in self.router.dispatch(views, self._remaining):
            await self._send(a.instance_id, a.sample_ids)
        if self.router.queued:
            return
        col = st.collector
        for m in self.router.steal(self._views(st), self._remaining, col.position):
            if self.registry.get(m.target).state != ACTIVE:
                continue  # lost while earlier moves ran
            moved = await self._take_back(m.source, m.sample_ids)
            if moved:
                for sid in moved:
                    self.router.assign(sid, m.target)
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
        if exhausted:
            self._fail(StepFailed(
                f"step {st.meter.step}: samples {list(exhausted)} lost their instance more than "
                f"retry_budget={self.config.router.retry_budget} times", missing=col.missing()))
        elif now - st.last_progress > self.config.idle_timeout_s:
            missing = col.missing()
            self._fail(StepFailed(
                f"step {st.meter.step}: no token arrived for {now - st.last_progress:.1f} s "
                f"(idle_timeout_s={self.config.idle_timeout_s}); {len(missing)} samples unfinished: "
                f"{list(missing[:20])}{' ...' if len(missing) > 20 else ''}", missing=missing))
