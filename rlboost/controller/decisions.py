"""StepDecisions: what the controller should do each tick of a running step. It closes the
local window (or asks for the reserved instances back), places queued samples, steals work
for idle slots, and fails a step that cannot finish.

Decisions only read: they ask the policies (offload window, router) with the current
measurements and return actions that the service carries out through the mover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlboost.controller.clock import Clock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.engines import EngineTable
from rlboost.controller.estimates import LengthModel
from rlboost.controller.offload import WindowContext, WindowPolicy
from rlboost.controller.registry import ACTIVE, DRAINING, InstanceRecord, Registry
from rlboost.controller.router import Assign, InstanceView, Move, Router
from rlboost.controller.step import StepState
from rlboost.errors import StepFailed

if TYPE_CHECKING:
    from rlboost.controller.ahead import StepsAhead


@dataclass(frozen=True, slots=True)
class CloseWindow:
    """Close the local window: the reserved instances' samples (evacuate) move elsewhere."""

    num_preemptible: int
    evacuate: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReopenWindow:
    """Queued samples can run only on the reserved instances, which the trainer does not hold yet."""


@dataclass(frozen=True, slots=True)
class AskForReserved:
    """Queued samples can run only on the reserved instances, which the trainer holds: ask for them."""


@dataclass(frozen=True, slots=True)
class RolloutDone:
    """Every sample is done: the rollout part of the step ends now."""

    num_preemptible: int


@dataclass(frozen=True, slots=True)
class FailStep:
    error: StepFailed


WindowAction = CloseWindow | ReopenWindow | AskForReserved
CheckAction = RolloutDone | FailStep


class StepDecisions:
    """Per-tick decisions of a running step. From the table it needs only which instances
    have an engine (`in`) and their measured rates (`rates(instance_id)`)."""

    def __init__(self, config: ControllerConfig, clock: Clock, *, table: EngineTable, registry: Registry,
                 router: Router, lengths: LengthModel, policy: WindowPolicy):
        self.config, self.clock, self.table, self.registry = config, clock, table, registry
        self.router, self.lengths, self.policy = router, lengths, policy
        self.ahead: StepsAhead | None = None  # bounded staleness: the steps ahead (controller.ahead)

    def context(self, st: StepState) -> WindowContext:
        """The running step as the offload policy sees it."""
        routable = self.registry.routable()
        preemptible = sum(1 for r in routable if r.kind == "preemptible")

        def rate(kind: str) -> float:
            return sum(self.table.rates(r.instance_id).full_rate(r.info.capacity)
                       for r in routable if r.kind == kind and r.instance_id in self.table)
        col = st.collector
        missing = col.missing()
        remaining = self.lengths.expected_remaining_total([col.progress(s) for s in missing],
                                                          [col.max_new(s) for s in missing])
        return WindowContext(
            elapsed_s=self.clock.now() - st.meter.started_at, generated_tokens=col.tokens,
            remaining_tokens=remaining,
            local_tokens_per_s=rate("reserved"), remote_tokens_per_s=rate("preemptible"),
            num_preemptible=preemptible)

    def window(self, st: StepState) -> WindowAction | None:
        """Close the local window when the policy says so. When queued samples can run only on
        the reserved instances: reopen it, or, once the trainer holds them, ask for them."""
        remote = [r for r in self.registry.routable("preemptible") if r.instance_id in self.table]
        if st.window_open:
            if st.collector.all_done:
                return None
            if remote and self.policy.should_close(self.context(st)) and not self._reserved_only(st, remote):
                reserved = tuple(r.instance_id for r in self.registry.live()
                                 if r.kind == "reserved" and r.instance_id in self.table)
                return CloseWindow(num_preemptible=len(remote), evacuate=reserved)
        elif self._reserved_only(st, remote, self.router.queued):
            if not st.handed_over:  # the trainer was not told they are free: take them back
                return ReopenWindow()
            if not st.reserved_needed:
                return AskForReserved()
        return None

    def _reserved_only(self, st: StepState, remote: list[InstanceRecord], sids=None) -> bool:
        """Whether any of sids (default: every unfinished sample) can run on no preemptible
        instance: closing the window would strand it."""
        sids = st.collector.missing() if sids is None else sids
        if not sids:
            return False
        views = [self._view(r, accepts=True) for r in remote]
        length = st.collector.max_length
        return any(not any(self.router.can_run(sid, v, length) for v in views) for sid in sids)

    def _view(self, rec: InstanceRecord, *, accepts: bool, time_left_s: float | None = None) -> InstanceView:
        return InstanceView(rec.instance_id, rec.info.capacity, self.table.rates(rec.instance_id), accepts,
                            rec.info.max_model_len, time_left_s)

    def _views(self, st: StepState) -> list[InstanceView]:
        """Instances that hold or may take samples. A draining one takes only samples that fit
        before its drain time, less one poll interval (its last tokens must be collected by
        then), and only once its rate has been measured rather than assumed."""
        views = []
        for rec in self.registry.live():
            if rec.instance_id not in self.table or rec.state not in (ACTIVE, DRAINING):
                continue
            if rec.kind == "reserved" and not st.window_open:
                continue
            accepts, left = self.registry.takes_work(rec), self.registry.time_left_s(rec)
            if left is not None:
                accepts = accepts and self.table.rates(rec.instance_id).observed
                left -= self.config.poll_interval_s
            views.append(self._view(rec, accepts=accepts, time_left_s=left))
        return views

    def dispatch(self, st: StepState) -> list[Assign]:
        """Where queued samples start now."""
        col = st.collector
        return self.router.dispatch(self._views(st), self._remaining(st), col.max_length, self._budget(st),
                                    col.position)

    def steal(self, st: StepState) -> list[Move]:
        """Samples to move from busy instances to idle slots (once nothing is queued); none
        onto an instance that holds steps ahead's samples (its rate is shared with samples
        the running step's router does not count)."""
        col = st.collector
        moves = self.router.steal(self._views(st), self._remaining(st), col.position, col.max_length,
                                  self._budget(st))
        if self.ahead:
            moves = [m for m in moves if not any(lane.router.samples_on(m.target) for lane in self.ahead)]
        return moves

    def _remaining(self, st: StepState):
        col = st.collector
        return lambda sid: self.lengths.expected_remaining(col.progress(sid), col.max_new(sid))

    @staticmethod
    def _budget(st: StepState):
        """The most tokens a sample may still produce (what a deadline must allow for)."""
        col = st.collector
        return lambda sid: col.max_new(sid) - col.progress(sid)

    def check(self, st: StepState) -> CheckAction | None:
        """The rollout is done, or the step cannot finish (and why), or neither."""
        col, now = st.collector, self.clock.now()
        if col.all_done:
            if st.meter.rollout_done_at is None:
                return RolloutDone(len(self.registry.routable("preemptible")))
            return None
        exhausted = self.router.exhausted()
        stranded = self._stranded(st)
        if exhausted:
            return FailStep(StepFailed(
                f"step {st.meter.step}: samples {list(exhausted)} lost their instance more than "
                f"retry_budget={self.config.router.retry_budget} times", missing=col.missing()))
        if stranded:
            why = "; ".join(f"sample {sid}: " + ", ".join(f"{i} refused it ({r})" for i, r in sorted(
                self.router.refusals(sid).items())) for sid in stranded[:5])
            return FailStep(StepFailed(f"step {st.meter.step}: no instance will run samples {stranded[:20]}: {why}",
                                       missing=col.missing()))
        if not st.ahead and now - st.last_progress > self.config.idle_timeout_s:
            missing = col.missing()
            hint = (" (the reserved instances are needed back: call lend_reserved())"
                    if st.reserved_needed else "")
            return FailStep(StepFailed(
                f"step {st.meter.step}: no token arrived for {now - st.last_progress:.1f} s "
                f"(idle_timeout_s={self.config.idle_timeout_s}){hint}; {len(missing)} samples unfinished: "
                f"{list(missing[:20])}{' ...' if len(missing) > 20 else ''}", missing=missing))
        return None

    def _stranded(self, st: StepState) -> list[int]:
        """Queued samples that every live instance has refused (or cannot fit)."""
        candidates = [self._view(r, accepts=True) for r in self.registry.live()
                      if r.instance_id in self.table and r.state != DRAINING]
        if not candidates:
            return []
        length = st.collector.max_length
        return [sid for sid in self.router.queued if self.router.refusals(sid)
                and not any(self.router.can_run(sid, v, length) for v in candidates)]
