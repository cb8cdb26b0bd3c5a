"""LoopThread: a thread that owns an asyncio-driven object (SGLang's Engine, vLLM's AsyncLLM),
runs its event loop while nothing is asked, and runs each submitted call with the loop
stopped (where the call may drive the loop itself, with run_until_complete).

SGLang's Engine binds an event loop when it is built and its synchronous methods drive that
loop with run_until_complete, which fails while the loop runs. Building the engine in this
thread and calling it only between loop turns keeps both its streams and its synchronous
methods usable, with every engine access on one thread.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

from rlboost.errors import RolloutError

T = TypeVar("T")


class LoopThread:
    """Usage: t = LoopThread(build, name=...); t.owned (what build returned), t.loop,
    t.call(fn) -> fn's result, t.stop(cleanup) (cleanup runs on the thread, last)."""

    def __init__(self, build: Callable[[], Any], *, name: str):
        self._lock = threading.Lock()
        self._calls: list[tuple[Callable[[], Any], Future]] = []
        self._stopping: Callable[[], None] | None = None
        self._done = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.owned: Any = None
        ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(build, ready), name=name, daemon=True)
        self._thread.start()
        try:
            ready.result()
        except BaseException:
            self._thread.join()
            raise

    @property
    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the thread between loop turns; re-raise what it raises."""
        fut: Future = Future()
        with self._lock:
            if self._done or self._stopping is not None:
                raise RolloutError("engine is closed")
            self._calls.append((fn, fut))
            self.loop.call_soon_threadsafe(self._wake.set)
        return fut.result()

    def stop(self, cleanup: Callable[[], None]) -> None:
        """Finish the calls already queued, run cleanup on the thread, and end it."""
        with self._lock:
            if self._done or self._stopping is not None:
                return
            self._stopping = cleanup
            self.loop.call_soon_threadsafe(self._wake.set)
        if not self.on_thread:
            self._thread.join()

    def _run(self, build: Callable[[], Any], ready: Future) -> None:
        # A current loop for this thread before the build: SGLang versions that take
        # asyncio.get_event_loop() bind it; newer ones make their own, and that one is used.
        first = asyncio.new_event_loop()
        asyncio.set_event_loop(first)
        try:
            self.owned = build()
            self.loop = getattr(self.owned, "loop", first)
            self._wake = asyncio.Event()
        except BaseException as e:
            self._done = True
            first.close()
            ready.set_exception(e)
            return
        if self.loop is not first:
            first.close()
        ready.set_result(None)
        cleanup = None
        try:
            while cleanup is None:
                self.loop.run_until_complete(self._wait())
                with self._lock:
                    calls, self._calls = self._calls, []
                    cleanup = self._stopping
                for fn, fut in calls:
                    _run_call(fn, fut)
        finally:
            try:
                if cleanup is not None:
                    cleanup()
            finally:
                with self._lock:
                    self._done = True
                    pending, self._calls = self._calls, []
                for _, fut in pending:
                    fut.set_exception(RolloutError("engine closed before the call ran"))

    async def _wait(self) -> None:
        await self._wake.wait()
        self._wake.clear()


def _run_call(fn: Callable[[], Any], fut: Future) -> None:
    try:
        result = fn()
    except BaseException as e:  # handed to the caller, who re-raises it
        fut.set_exception(e)
    else:
        fut.set_result(result)
