"""EpisodeDriver: multi-turn samples (episodes) between their turns. When a sample's turn
ends (the collector holds it, awaiting), the driver asks the environment host for the
answer, once per turn; when the answer comes it is applied on the controller's loop: the
observation's tokens join the sample's output (masked as not the model's) and the sample
is queued again, to go on from its last token on whichever engine the router picks, or the
episode ends. Engines never run a tool: a preemption takes generation state only, and a
turn that is generated again after one (the same tokens: draws depend on seed, sample and
position) is still one call, since the host answers each (sample, turn, call id) once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from rlboost.controller.clock import Clock
from rlboost.controller.router import Router
from rlboost.controller.step import StepState
from rlboost.errors import EpisodeError


@dataclass(frozen=True, slots=True)
class _Answer:
    sample_id: int
    observation_ids: tuple[int, ...]
    done: bool
    reward: float | None


class EpisodeDriver:
    """Feeds environment answers back into the running step (see the module docstring).

    host: the EpisodeHost (rlboost.environments.turns), a Ray actor handle or an object in
    this process; fail(error) fails the step (a host that cannot answer); wake() tells the
    controller's loop that something changed."""

    def __init__(self, clock: Clock, router: Router, host: Any, *, fail: Callable[[BaseException], None],
                 wake: Callable[[], None]):
        self.clock, self.router, self.host = clock, router, host
        self.fail, self.wake = fail, wake
        self._answers: list[tuple[StepState, _Answer]] = []
        self._tasks: set[asyncio.Task] = set()
        self.calls = 0  # turns handed to the host

    def advance(self, st: StepState) -> None:
        """One round: apply the answers that came, then ask for the turns that ended."""
        answers, self._answers = self._answers, []
        col = st.collector
        for owner, a in answers:
            if owner is not st or st.failure is not None:
                continue  # a step that ended or failed meanwhile
            room = col.max_new(a.sample_id) - col.progress(a.sample_id) - len(a.observation_ids)
            done = a.done or room < 1  # no token left for another turn: the episode ends here
            col.observe(a.sample_id, a.observation_ids, done=done, reward=a.reward, now=self.clock.now())
            st.last_progress = self.clock.now()
            if done:
                self._close(a.sample_id)
            else:
                self.router.requeue([a.sample_id], failed=False)
        for sid in col.take_turn_ends():
            self.router.unassign(sid)  # its engine is done with it until the answer comes
            turn, ids, reason = col.turn(sid)
            self._spawn(self._ask(st, sid, turn, ids, reason))

    async def _ask(self, st: StepState, sid: int, turn: int, ids: tuple[int, ...], reason: str) -> None:
        self.calls += 1
        try:
            answer = await _call(self.host, "answer", sid, turn, ids, reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the host is on a reserved node: its failure fails the step
            self.fail(EpisodeError(f"sample {sid}: the environment host did not answer turn {turn}: "
                                   f"{' '.join(str(exc).split())[:300]}"))
            return
        self._answers.append((st, _Answer(sid, tuple(answer.observation_ids), answer.done, answer.reward)))
        self.wake()

    def _close(self, sid: int) -> None:
        self._spawn(self._close_quietly(sid))

    async def _close_quietly(self, sid: int) -> None:
        try:
            await _call(self.host, "close", sid)
        except Exception:
            pass  # the host keeps the episode until it ends; nothing of the run waits on it

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _call(host: Any, method: str, *args: Any) -> Any:
    """host.method(*args), awaited: through Ray for an actor handle, else on this loop."""
    fn = getattr(host, method)
    remote = getattr(fn, "remote", None)
    return await (remote(*args) if remote is not None else fn(*args))
