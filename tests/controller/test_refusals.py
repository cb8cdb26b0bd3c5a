"""An engine that refuses samples is not a dead engine: the controller finds the offending
samples, offers them elsewhere, fails the step naming them if nobody takes them, and keeps
every instance. Only failed calls lose an instance (and a live one is told to drop its samples)."""

import pytest
from controller_fakes import RecordingEngineForTests, add_instance, outputs, run_service, run_step, uninterrupted

from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import ReferenceWindowConfig, ReferenceWindowRule
from rlboost.controller.records import GROUP_STRIDE, PromptGroup
from rlboost.errors import StepFailed
from rlboost.migration.state import SamplingParams
from rlboost.sim import make_groups

GROUPS = make_groups(0, num_groups=3, group_size=2, prompt_len=4, max_new_tokens=20)
POISON = PromptGroup(group_id=99, prompt_ids=(1, 2, 3), params=SamplingParams(max_new_tokens=500, stop_token_ids=(2,)),
                     num_samples=1, seed=0)


def scenario(body, **cfg):
    config = ControllerConfig(**{**dict(poll_interval_s=0.1, idle_timeout_s=30.0, call_timeout_s=1.0), **cfg})
    return run_service(body, config, ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=0.0, floor_s=0)))


def fleet(svc, clock, log, *, declare: bool):
    add_instance(svc, clock, log, "reserved-0", "reserved", capacity=4, max_model_len=128,
                 declare_max_model_len=declare, sample_tokens_per_s=20.0)
    for i in range(3):
        add_instance(svc, clock, log, f"spot-{i}", capacity=4, max_model_len=128, declare_max_model_len=declare,
                     sample_tokens_per_s=20.0)


def test_a_sample_every_engine_refuses_fails_the_step_by_name_and_costs_no_instance():
    async def body(svc, clock, log):
        fleet(svc, clock, log, declare=False)
        await clock.asleep(0.5)
        with pytest.raises(StepFailed) as info:
            await run_step(svc, clock, 0, [*GROUPS, POISON], 0)
        metrics = await svc.end_step()
        return info.value, metrics, {s.instance_id: s.state for s in svc.instances()}
    (err, metrics, states), _ = scenario(body)
    poison = 99 * GROUP_STRIDE
    assert f"[{poison}]" in str(err) and "max_model_len" in str(err) and "spot-0 refused it" in str(err)
    assert states == {"reserved-0": "active", "spot-0": "active", "spot-1": "active", "spot-2": "active"}
    assert metrics.deaths == 0


def test_a_sample_longer_than_every_declared_max_model_len_is_refused_at_step_start():
    async def body(svc, clock, log):
        fleet(svc, clock, log, declare=True)
        await clock.asleep(0.5)
        with pytest.raises(ValueError, match="max_model_len"):
            svc.start_step(0, [*GROUPS, POISON], 0)
        return await run_step(svc, clock, 0, GROUPS, 0)  # nothing was started: the step can begin
    (batches, metrics), _ = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)


def test_samples_go_only_where_their_length_fits():
    long_group = PromptGroup(group_id=7, prompt_ids=(1, 2, 3), params=SamplingParams(max_new_tokens=200),
                             num_samples=2, seed=3)

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=4, max_model_len=512, sample_tokens_per_s=50.0)
        add_instance(svc, clock, log, "spot-0", capacity=8, max_model_len=64, sample_tokens_per_s=50.0)
        return await run_step(svc, clock, 0, [*GROUPS, long_group], 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted([*GROUPS, long_group])
    assert not [e for e in log if e.instance == "spot-0" and set(e.ids) & set(long_group.sample_ids)]
    assert metrics.deaths == 0


def test_an_instance_that_loaded_a_newer_version_than_reported_is_not_lost():
    groups = make_groups(1, num_groups=2, group_size=4, prompt_len=4, max_new_tokens=40)
    holder = {}

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=8, sample_tokens_per_s=20.0)
        holder["spot"] = add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=20.0)
        await clock.asleep(0.5)  # both report version 0
        svc.set_weight_version(1)  # staleness 1: version-0 instances stay routable
        holder["spot"].engine.load_weights({}, 1)  # pulled version 1; its report has not arrived
        return await run_step(svc, clock, 1, groups, 1)
    (batches, metrics), log = scenario(body, max_staleness=1)
    assert metrics.deaths == 0
    got = outputs(batches)
    assert got.keys() == {s for g in groups for s in g.sample_ids}
    assert [e for e in log if e.instance == "spot-0" and e.method == "submit"]


class PollBreaksForTests(RecordingEngineForTests):
    """A live engine whose poll fails once with an unexpected error (not a refusal)."""

    broken = False

    async def poll(self):
        if self.broken:
            self.broken = False
            await self._enter("poll")
            raise RuntimeError("driver bug")
        return await super().poll()


def test_a_lost_engine_that_may_still_run_is_told_to_drop_its_samples():
    holder = {}

    async def body(svc, clock, log):
        from controller_fakes import engine_config

        from rlboost.controller.records import InstanceInfo
        from rlboost.rollout.emulated.engine import EmulatedEngine

        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        engine = EmulatedEngine(engine_config(max_running=8, sample_tokens_per_s=10.0), clock=clock)
        engine.load_weights({}, 0)
        holder["spot"] = PollBreaksForTests("spot-0", engine, log, clock)
        svc.register(InstanceInfo(instance_id="spot-0", kind="preemptible", capacity=8), holder["spot"])

        def breaks():
            holder["held"] = engine.load().running + engine.load().queued
            holder["spot"].broken = True
        import asyncio

        async def later():
            await clock.asleep(2.0)
            breaks()
        asyncio.ensure_future(later())
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.deaths == 1 and holder["held"] > 0
    aborts = [e for e in log if e.instance == "spot-0" and e.method == "abort"]
    assert aborts and holder["spot"].engine.load().running + holder["spot"].engine.load().queued == 0
