"""Virtual time: sleeps and timeouts cost no real time, and a stuck program fails loudly."""

import asyncio

import pytest

from rlboost.controller.clock import ManualClock, MonotonicClock, VirtualTimeDeadlock, run_virtual


def test_concurrent_sleeps_and_timeouts_run_on_virtual_time():
    async def main(clock):
        order = []

        async def nap(name, s):
            await clock.asleep(s)
            order.append((name, clock.now()))
        await asyncio.gather(nap("b", 20.0), nap("a", 5.0))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 100.0)
        return order, clock.now()
    order, end = run_virtual(main)
    assert order == [("a", 5.0), ("b", 20.0)]
    assert end == pytest.approx(120.0)


def test_waiting_on_something_that_never_happens_is_a_deadlock_not_a_hang():
    async def main(clock):
        await asyncio.Event().wait()
    with pytest.raises(VirtualTimeDeadlock, match="deadlock"):
        run_virtual(main)


def test_tasks_that_keep_waking_without_time_passing_fail_loudly():
    async def main(clock):
        while True:
            await asyncio.sleep(0)
    with pytest.raises(VirtualTimeDeadlock, match="stuck"):
        run_virtual(main)


def test_blocking_sleep_on_a_virtual_clock_is_refused():
    async def main(clock):
        clock.sleep(1.0)
    with pytest.raises(RuntimeError, match="asleep"):
        run_virtual(main)


def test_manual_and_monotonic_clocks():
    m = ManualClock(10.0)
    m.advance(2.5)
    assert m.now() == 12.5
    with pytest.raises(ValueError):
        m.advance(-1.0)
    with pytest.raises(ValueError):
        MonotonicClock(0.0)
    fast = MonotonicClock(1000.0)
    t0 = fast.now()
    fast.sleep(50.0)  # 50 ms of real time
    assert fast.now() - t0 >= 50.0
