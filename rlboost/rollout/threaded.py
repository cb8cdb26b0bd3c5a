"""What the engines that run on a thread of their own share: the lock their public calls
and that thread meet on, the token deltas waiting for poll(), the closed / failed state,
and the context-manager lifetime."""

from __future__ import annotations

import threading

from rlboost.errors import RolloutError
from rlboost.rollout.engine import PendingDeltas, TokenDelta


class ThreadedEngineState:
    """Base of the embedded and SGLang engines. Subclasses call _init_state() first in
    __init__, fill self._deltas under self._cond (and notify it) from their thread, set
    self._failure when that thread dies, and implement close() with _mark_closed()."""

    _failure_label = "engine loop"

    def _init_state(self) -> None:
        self._cond = threading.Condition()
        self._deltas = PendingDeltas()
        self._counts = (0, 0, 0)  # running, queued, queued tokens
        self._closed = False
        self._failure: BaseException | None = None

    def poll(self, timeout_s: float) -> list[TokenDelta]:
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        with self._cond:
            self._cond.wait_for(lambda: self._deltas or self._closed or self._failure, timeout_s)
            self._check_usable()
            return self._deltas.take()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RolloutError(f"{self._failure_label} failed: {self._failure!r}") from self._failure
        if self._closed:
            raise RolloutError("engine is closed")

    def _mark_closed(self) -> bool:
        """Marks the engine closed and wakes every waiter; False if it already was."""
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            self._cond.notify_all()
            return True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
