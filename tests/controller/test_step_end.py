"""end_step() leaves nothing of its step running anywhere, even while engine calls take a
while to answer (as Ray calls do), so the next step starts clean, whatever ids it reuses."""

import asyncio

from controller_fakes import engine_config, outputs, run_step, uninterrupted

from rlboost.controller.adapters import InProcessEngine
from rlboost.controller.clock import run_virtual
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import ReferenceWindowConfig, ReferenceWindowRule
from rlboost.controller.records import InstanceInfo
from rlboost.controller.service import RolloutService
from rlboost.rollout.emulated.engine import EmulatedEngine
from rlboost.sim import make_groups


class SlowCallsForTests(InProcessEngine):
    """An in-process engine whose calls take `latency_s` each way, like a remote call: the
    engine acts half-way, and its answer (a poll's deltas, say) arrives latency_s later."""

    def __init__(self, engine, latency_s: float, poll_answer_s: float | None = None):
        super().__init__(engine)
        self.latency_s = latency_s
        self.poll_answer_s = latency_s if poll_answer_s is None else poll_answer_s  # deltas are bulky

    async def _call(self, fn, *args, **kwargs):
        await asyncio.sleep(self.latency_s)
        result = fn(*args, **kwargs)
        await asyncio.sleep(self.poll_answer_s if fn == self.engine.poll else self.latency_s)
        return result


def with_slow_engines(body, *, count=8, latency_s=0.2, poll_answer_s=None):
    async def main(clock):
        svc = RolloutService(ControllerConfig(poll_interval_s=0.01, call_timeout_s=5.0), clock=clock,
                             window_policy=ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=1e6,
                                                                                     floor_s=0)))
        await svc.start()
        engines = []
        for i in range(count):
            e = EmulatedEngine(engine_config(max_running=4, sample_tokens_per_s=50.0),
                               clock=clock)
            e.load_weights({}, 0)
            engines.append(e)
            svc.register(InstanceInfo(instance_id=f"reserved-{i}", kind="reserved", capacity=4),
                         SlowCallsForTests(e, latency_s, poll_answer_s))
        await clock.asleep(0.5)
        try:
            return await body(svc, clock, engines)
        finally:
            await svc.close()
    return run_virtual(main)


def test_ending_a_step_early_leaves_no_sample_on_any_engine():
    groups = make_groups(0, num_groups=100, group_size=4, prompt_len=4, max_new_tokens=400)

    async def body(svc, clock, engines):
        svc.start_step(0, groups, 0)
        await clock.asleep(0.7)
        busy = sum(e.load().running + e.load().queued for e in engines)
        await svc.end_step()  # the trainer gives up on this step
        left = {i: e.load().running + e.load().queued for i, e in enumerate(engines)}
        svc.set_weight_version(1)
        for e in engines:  # an engine still holding samples would refuse the next weights
            e.load_weights({}, 1)
        return busy, left
    busy, left = with_slow_engines(body)
    assert busy > 0
    assert set(left.values()) == {0}


def test_a_step_reusing_the_ids_of_an_aborted_step_gets_none_of_its_tokens():
    groups = make_groups(0, num_groups=8, group_size=4, prompt_len=4, max_new_tokens=60)
    again = make_groups(0, num_groups=8, group_size=4, prompt_len=4, max_new_tokens=60, seed=1)  # same ids

    async def body(svc, clock, engines):
        svc.start_step(0, groups, 0)
        await clock.asleep(0.35)  # polls are in flight when the trainer ends the step
        await svc.end_step()
        return await run_step(svc, clock, 1, again, 0)  # same ids and weights, other seed: other tokens
    batches, metrics = with_slow_engines(body, count=3, latency_s=0.05, poll_answer_s=0.5)
    assert [g.group_id for g in again] == [g.group_id for g in groups]
    assert outputs(batches) == uninterrupted(again)
    assert metrics.duplicates == 0 and metrics.gaps == 0 and metrics.deaths == 0
