"""Clocks the controller and the emulated engines read time from: real, accelerated or virtual.

Policy and driver code never call time.monotonic() or asyncio.sleep() directly; they take a
clock, so the same code runs on wall-clock time in production, on accelerated time in
benches, and on deterministic virtual time (a VirtualTimeLoop) in tests.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from typing import Awaitable, Callable, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """A source of seconds. `virtual` clocks only move when the program lets them."""

    virtual: bool
    speed: float  # clock seconds per second of the asyncio loop's time

    def now(self) -> float:
        """Seconds since an arbitrary origin."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread (real clocks only)."""

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task."""


class MonotonicClock:
    """Wall-clock time, optionally accelerated: `speed=10` makes 1 s of clock pass in 0.1 s.

    The origin is the moment of construction (or of unpickling, in another process), so
    clocks in different processes agree on durations, not on absolute values.
    """

    virtual = False

    def __init__(self, speed: float = 1.0):
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.speed = float(speed)
        self._origin = time.monotonic()

    def __reduce__(self):
        return (MonotonicClock, (self.speed,))

    def now(self) -> float:
        return (time.monotonic() - self._origin) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speed)


class ManualClock:
    """Time that moves only when advance() is called: for unit tests of pure policy code."""

    virtual = True
    speed = 1.0

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move time backwards by {seconds}")
        self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    async def asleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


class VirtualTimeDeadlock(RuntimeError):
    """Every task of a virtual-time program waits and no timer is pending: it can never finish."""


class VirtualClock:
    """The clock of a VirtualTimeLoop: jumps to the next timer whenever all tasks wait.

    Create one with run_virtual(); engines and the controller share it, so a step that
    takes minutes of emulated time runs in milliseconds and always the same way.
    """

    virtual = True
    speed = 1.0  # loop seconds per clock second: asyncio timeouts are already virtual

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        raise RuntimeError("a blocking sleep on a virtual clock would stall the whole program; "
                           "await clock.asleep() instead")

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def _jump(self, seconds: float) -> None:
        self._now += seconds


class _VirtualSelector(selectors.DefaultSelector):
    """Instead of waiting `timeout` seconds for I/O, move the virtual clock forward by it."""

    # loop iterations at one instant before the program counts as stuck (a livelock)
    MAX_STALLED = 200_000

    def __init__(self, clock: VirtualClock):
        super().__init__()
        self._clock = clock
        self._stalled = 0

    def select(self, timeout=None):
        if timeout is None:
            raise VirtualTimeDeadlock(
                "no task can make progress and no timer is pending (virtual-time deadlock)")
        if timeout > 0:
            self._clock._jump(timeout)
            self._stalled = 0
        else:
            self._stalled += 1
            if self._stalled > self.MAX_STALLED:
                raise VirtualTimeDeadlock(
                    f"virtual time stuck at {self._clock.now()} for {self.MAX_STALLED} loop iterations "
                    "(tasks keep waking without time passing)")
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose time() is a VirtualClock: sleeps and timeouts cost no real time."""

    def __init__(self, clock: VirtualClock):
        super().__init__(_VirtualSelector(clock))
        self.clock = clock

    def time(self) -> float:
        return self.clock.now()


def run_virtual(main: Callable[[VirtualClock], Awaitable[T]], *, start: float = 0.0) -> T:
    """Run main(clock) to completion on virtual time and return its result.

    >>> async def nap(clock):
    ...     await clock.asleep(3600.0)
    ...     return clock.now()
    >>> run_virtual(nap)
    3600.0
    """
    clock = VirtualClock(start)
    loop = VirtualTimeLoop(clock)
    try:
        return loop.run_until_complete(main(clock))
    finally:
        loop.close()
