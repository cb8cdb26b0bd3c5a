"""StepRound: what one controller round does with the running step, over any mover.

It asks StepDecisions (window, dispatch, steal, check) and carries out their answers
through a Mover: evacuate instances whose preemption deadline is near, close or reopen the
local window, place queued samples, steal, and fail a stuck step. RolloutService runs it
over the SampleMover (real or emulated engines); the simulator runs the same round over its
simulated engines, so both take the same decisions by the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Protocol

from rlboost.controller.clock import Clock
from rlboost.controller.decisions import AskForReserved, CloseWindow, FailStep, ReopenWindow, RolloutDone, StepDecisions
from rlboost.controller.registry import Registry
from rlboost.controller.router import Router
from rlboost.controller.step import Outcome, StepState

if TYPE_CHECKING:
    from rlboost.controller.ahead import StepsAhead


class Mover(Protocol):
    """Moves samples between engines (controller.mover.SampleMover is the real one)."""

    async def evacuate(self, st: StepState, iid: str) -> Outcome:
        """Take every sample off the instance and queue the unfinished ones again."""

    async def take_back(self, st: StepState, iid: str, sids: Sequence[int]) -> Outcome:
        """Take samples off the instance; Outcome.moved holds the unfinished ones, unassigned."""

    async def send(self, st: StepState, iid: str, sids: Sequence[int]) -> Outcome:
        """Start samples on the instance (queued again if it cannot take them)."""

    async def retire(self, st: StepState | None, iid: str) -> Outcome:
        """Let a drained instance go."""


class Engines(Protocol):
    """What the round asks of the engine table: whether it holds an instance, and whether
    a sample's KV pages wait on some engine for their next placement."""

    def __contains__(self, iid: str) -> bool: ...

    def holds(self, sid: int) -> bool: ...


class StepRound:
    """The running step's part of a controller round: drains, the window, placement, the check.

    note(outcome) learns from each move; fail(error) fails the step; wake() tells the
    trainer's waiting calls that something changed (the window closed, reserved needed).
    """

    def __init__(self, clock: Clock, *, decisions: StepDecisions, registry: Registry, router: Router,
                 table: Engines, mover: Mover, note: Callable[[Outcome], Outcome],
                 fail: Callable[[BaseException], None], wake: Callable[[], None]):
        self.clock, self.decisions, self.registry, self.router = clock, decisions, registry, router
        self.table, self.mover = table, mover
        self.note, self.fail, self.wake = note, fail, wake

    async def drain_due(self, st: StepState | None) -> None:
        """Instances whose preemption deadline is near: move their samples out, then let them go.
        Samples whose KV pages wait on the draining engine are placed before it closes."""
        for rec in self.registry.drains_due():
            iid = rec.instance_id
            if st is not None and iid in self.table:
                out = self.note(await self.mover.evacuate(st, iid))
                if any(self.table.holds(s) for s in out.moved) and st.failure is None and not st.ending:
                    await self.place(st)
            if not rec.ended:
                self.note(await self.mover.retire(st, iid))

    async def run(self, st: StepState, *, check: bool = True) -> None:
        """The window, placement and (unless check is False) the check, for a running step."""
        if st.failure is not None or st.ending:
            return
        await self.window(st)
        await self.place(st)
        if check:
            self.check(st)

    async def window(self, st: StepState) -> None:
        action = self.decisions.window(st)
        if isinstance(action, CloseWindow):
            st.close_window(self.clock.now(), action.num_preemptible)
            for iid in action.evacuate:
                if iid in self.table:
                    self.note(await self.mover.evacuate(st, iid))
            self.wake()
        elif isinstance(action, ReopenWindow):
            st.reopen_window()
        elif isinstance(action, AskForReserved):
            st.reserved_needed = True
            self.wake()

    async def place(self, st: StepState) -> None:
        """Queued samples to the instances dispatch picks; then, with nothing queued, steals."""
        for a in self.decisions.dispatch(st):
            self.note(await self.mover.send(st, a.instance_id, a.sample_ids))
        if self.router.queued:
            return
        for m in self.decisions.steal(st):
            rec = self.registry.get(m.target)
            if rec is None or not self.registry.takes_work(rec):
                continue  # lost (or past its drain time) while earlier moves ran
            out = self.note(await self.mover.take_back(st, m.source, m.sample_ids))
            if out.moved:
                self.note(await self.mover.send(st, m.target, out.moved))

    async def place_ahead(self, st: StepState | None, ahead: StepsAhead,
                          open_next: Callable[[bool], bool] | None = None) -> None:
        """Bounded staleness: the steps ahead's prompts to free slots (controller.ahead's
        schedule), once the running step has nothing waiting for a slot; lanes in step order,
        a later one only once every earlier one's prompts are placed. open_next(reserved)
        opens the next lane if the schedule allows one now and says whether it did (None:
        the driver opens lanes itself, by starting steps ahead)."""
        # the reserved engines only while the running step's window is open and the trainer has
        # not been handed them (a rollout that finished inside the window hands them over open)
        reserved = st is not None and st.window_open and not st.handed_over and not st.ending
        if not reserved:
            await self._leave_reserved(ahead)
        if st is not None and self.router.queued:
            return
        held = ahead.held([self.router] if st is not None else [])
        i = 0
        while True:
            if i == len(ahead) and (open_next is None or not open_next(reserved)):
                return
            lane = ahead[i]
            if lane.router.queued:
                for a in ahead.dispatch(lane, ahead.views(lane, held, reserved)):
                    self.note(await self.mover.send(lane.st, a.instance_id, a.sample_ids))
                if lane.router.queued:
                    return  # later steps wait until this one's prompts have all started
            held.update(ahead.held([lane.router]))
            i += 1

    async def _leave_reserved(self, ahead: StepsAhead) -> None:
        """The reserved engines are the trainer's: the steps ahead's samples leave them."""
        for rec in self.registry.live():
            if rec.kind != "reserved" or rec.instance_id not in self.table:
                continue
            for lane in ahead:
                if lane.router.samples_on(rec.instance_id):
                    self.note(await self.mover.evacuate(lane.st, rec.instance_id))

    def check(self, st: StepState) -> None:
        action = self.decisions.check(st)
        if isinstance(action, RolloutDone):
            st.rollout_done(self.clock.now(), action.num_preemptible)
        elif isinstance(action, FailStep):
            self.fail(action.error)


def run_now(coro):
    """Run a coroutine that never waits (a simulated engine answers at once) to its result,
    without an event loop; raises RuntimeError if it tries to wait."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a synchronous round awaited something that does not answer at once")
