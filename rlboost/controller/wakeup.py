"""ChangeSignal: how the trainer's waiting calls learn that the controller's state changed,
and that the loop which changes it has stopped (so they raise instead of waiting forever).
"""

from __future__ import annotations

import asyncio

from rlboost.controller.clock import Clock
from rlboost.errors import RolloutError

_EPS_S = 1e-6


class ChangeSignal:
    """wake() releases every wait(); waits are bounded by deadlines on the controller's clock."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self._changed: asyncio.Event | None = None
        self._crashed: BaseException | None = None

    def start(self) -> None:
        """The loop runs from now on (waits need its event loop)."""
        self._changed = asyncio.Event()

    def wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def crashed(self, exc: BaseException) -> None:
        """The loop died outside any step: every later call raises exc instead of waiting."""
        self._crashed = exc
        self.wake()

    def check(self) -> None:
        if self._crashed is not None:
            raise RolloutError(f"the controller loop stopped: {self._crashed!r}") from self._crashed
        if self._changed is None:
            raise RolloutError("the controller loop is not running: await start() first")

    def expired(self, deadline: float) -> bool:
        # a tolerance, so float rounding cannot leave a deadline a few ulps away forever
        return self.clock.now() >= deadline - _EPS_S

    async def wait(self, deadline: float) -> None:
        """Until the next wake() or the deadline; the caller re-checks its condition."""
        self.check()
        left = deadline - self.clock.now()
        if left > _EPS_S:
            try:
                await asyncio.wait_for(self._changed.wait(), left / self.clock.speed)
            except asyncio.TimeoutError:
                pass  # the caller re-checks its condition and its deadline
