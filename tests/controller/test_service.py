"""The driver loop on virtual time, with recording engines: joins, notices, deaths, gating, windows."""

import pytest
from controller_fakes import (
    RecordingEngineForTests,
    add_instance,
    engine_config,
    outputs,
    run_service,
    run_step,
    uninterrupted,
)

from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import AdaptiveWindow, AdaptiveWindowConfig, ReferenceWindowConfig, ReferenceWindowRule
from rlboost.controller.records import InstanceInfo
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import RouterConfig
from rlboost.errors import RolloutError, StepFailed
from rlboost.migration.batch import MigrationBatch
from rlboost.rollout.emulated.engine import EmulatedEngine
from rlboost.sim import make_groups

GROUPS = make_groups(0, num_groups=4, group_size=4, prompt_len=4, max_new_tokens=60)


def config(**kw):
    base = dict(poll_interval_s=0.1, idle_timeout_s=20.0, call_timeout_s=1.0,
                registry=RegistryConfig(heartbeat_interval_s=1.0, missed_beats=3, drain_margin_s=2.0))
    return ControllerConfig(**{**base, **kw})


def window(seconds):
    return ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=seconds, floor_s=0.0))


def scenario(body, *, cfg=None, policy=None):
    return run_service(body, cfg or config(), policy or window(1.0))


def later(clock, seconds, fn):
    import asyncio

    async def go():
        await clock.asleep(seconds)
        fn()
    return asyncio.ensure_future(go())


def first(log, instance, method, after=-1.0):
    return min((e.t for e in log if e.instance == instance and e.method == method and e.t > after),
               default=None)


def test_instance_joining_mid_step_gets_work_and_results_match_an_uninterrupted_run():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=4, sample_tokens_per_s=10.0)
        later(clock, 0.5, lambda: add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=20.0))
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    joined_submit = first(log, "spot-0", "submit")
    assert joined_submit is not None and joined_submit >= 0.5
    assert first(log, "spot-0", "load") <= joined_submit  # contacted (version learned) before use
    assert metrics.window_s >= 1.0  # the window could not close before a preemptible instance existed
    assert dict(metrics.tokens_per_instance)["spot-0"] > 0


def test_notice_drains_samples_before_the_deadline_and_they_finish_elsewhere():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=10.0)
        add_instance(svc, clock, log, "spot-1", capacity=8, sample_tokens_per_s=10.0)
        later(clock, 2.0, lambda: svc.notice("spot-0", 3.0))
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    exports = [e for e in log if e.instance == "spot-0" and e.method == "export" and e.t >= 2.0]
    assert exports and exports[0].ids, "spot-0 held samples when the notice came"
    assert 3.0 <= exports[0].t < 5.0  # drain_margin_s before the 5 s deadline, not at once
    assert not [e for e in log if e.instance == "spot-0" and e.method == "submit" and e.t >= 2.0]
    resumed = [e for e in log if e.method == "submit" and e.t >= exports[0].t and set(e.ids) & set(exports[0].ids)]
    assert resumed and resumed[0].instance == "spot-1"
    assert metrics.preemptions == 1 and metrics.deaths == 0 and metrics.resumes == 0
    assert metrics.migrations >= len(exports[0].ids)


def test_sudden_death_resumes_samples_from_their_last_collected_token():
    holder = {}

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        holder["spot"] = add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=10.0)
        add_instance(svc, clock, log, "spot-1", capacity=8, sample_tokens_per_s=10.0)
        later(clock, 2.5, holder["spot"].kill)
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.deaths == 1 and metrics.resumes > 0 and metrics.reprefill_tokens > 0
    on_dead = {i for e in log if e.instance == "spot-0" and e.method == "submit" for i in e.ids}
    resumed = [e for e in log if e.t >= 2.5 and e.method == "submit" and set(e.ids) & on_dead]
    assert resumed and all(e.instance != "spot-0" for e in resumed)
    assert any(p > 0 for e in resumed for p in e.progress)  # not restarted from scratch


def test_zero_preemptible_instances_the_reserved_engine_finishes_everything():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=8, sample_tokens_per_s=10.0)
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.offload_share == 0.0 and metrics.migrations == 0
    assert metrics.window_s == pytest.approx(metrics.rollout_time_s)  # never closed while work remained
    assert metrics.window_s > 1.0  # well past the 1 s window the policy asked for


def test_instances_at_a_stale_weight_version_get_no_work_until_they_load_the_current_one():
    holder = {}

    async def body(svc, clock, log):
        svc.set_weight_version(1)
        add_instance(svc, clock, log, "reserved-0", "reserved", version=1, capacity=4, sample_tokens_per_s=10.0)
        holder["old"] = add_instance(svc, clock, log, "spot-old", version=0, capacity=8, sample_tokens_per_s=10.0)

        def upgrade():
            log.append(type(log[0])(clock.now(), "spot-old", "loaded-v1", ()))
            holder["old"].engine.load_weights({}, 1)
        later(clock, 1.5, upgrade)
        return await run_step(svc, clock, 0, GROUPS, 1)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS, version=1)
    assert all(s.weight_version == 1 for mb in batches for g in mb.groups for s in g.samples)
    loaded = first(log, "spot-old", "loaded-v1")
    submits = [e.t for e in log if e.instance == "spot-old" and e.method == "submit"]
    assert submits and min(submits) >= loaded == 1.5


def test_window_closes_early_when_every_sample_is_done():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=50.0)
        add_instance(svc, clock, log, "spot-0", version=None, capacity=8)  # never gets weights
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body, policy=window(100.0))
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.planned_window_s == 100.0
    assert metrics.window_s == pytest.approx(metrics.rollout_time_s) and metrics.window_s < 5.0


def test_a_rollout_that_finishes_inside_the_window_shortens_the_next_one():
    # A delay learned where the window had to be long (say, one slow instance) must not keep
    # the window open through whole rollouts once it need not be: groups that all waited
    # for the trainer are slack the policy learns from, as after a closed window.
    policy = AdaptiveWindow(AdaptiveWindowConfig(down_gain=0.5))
    policy.train_s_per_token = 0.01
    policy.delays[1] = 100.0

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=50.0)
        add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=50.0)
        return await run_step(svc, clock, 0, groups, 0, train_s_per_token=0.01)
    # groups that finish one after another (10 to 160 tokens per sample, no early stop)
    groups = [g for i, n in enumerate((10, 40, 80, 160))
              for g in make_groups(i, num_groups=1, group_size=4, prompt_len=4, max_new_tokens=n, stop_token_ids=())]
    (batches, metrics), log = scenario(body, policy=policy)
    assert outputs(batches) == uninterrupted(groups)
    assert metrics.num_preemptible == 1 and metrics.trainer_idle_s == 0.0
    assert metrics.window_s == pytest.approx(metrics.rollout_time_s)  # the window never closed
    # the first group waited over a second for the trainer: the delay shrinks by half of that
    assert policy.delays[1] < 99.5


def test_reserved_instances_come_back_only_when_the_trainer_lends_them():
    holder = {}

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        holder["spot"] = add_instance(svc, clock, log, "spot-0", capacity=16, sample_tokens_per_s=10.0)
        later(clock, 2.0, holder["spot"].kill)
        return await run_step(svc, clock, 0, GROUPS, 0, log=log)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.reopened == 1 and metrics.deaths == 1
    handed = first(log, "trainer", "lend_reserved")
    assert handed is not None and handed >= 2.0
    # after the window closed, nothing went to the reserved instance until the trainer lent it
    closed = metrics.window_s
    assert not [e for e in log if e.instance == "reserved-0" and e.method in ("submit", "import")
                and closed < e.t < handed]
    assert first(log, "reserved-0", "submit", after=handed - 1e-9) is not None


def test_without_a_lend_the_step_fails_saying_the_reserved_instances_are_needed():
    holder = {}

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        holder["spot"] = add_instance(svc, clock, log, "spot-0", capacity=16, sample_tokens_per_s=10.0)
        later(clock, 2.0, holder["spot"].kill)
        svc.start_step(0, GROUPS, 0)
        assert await svc.wait_window_closed(30.0)  # the trainer now uses the reserved GPUs
        got_none_early = None
        with pytest.raises(StepFailed, match="lend_reserved"):
            while True:
                before = clock.now()
                mb = await svc.next_microbatch(30.0)
                if mb is None and got_none_early is None and svc.reserved_needed():
                    got_none_early = clock.now() - before < 30.0
        closed = (await svc.end_step()).window_s
        return got_none_early, closed
    (early, closed), log = scenario(body, cfg=config(idle_timeout_s=5.0))
    assert early  # a waiting next_microbatch returned at once to say so
    assert not [e for e in log if e.instance == "reserved-0" and e.method in ("submit", "import") and e.t > closed]


def test_silent_instance_is_declared_lost_after_the_call_timeout():
    holder = {}

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        holder["spot"] = add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=10.0)
        add_instance(svc, clock, log, "spot-1", capacity=8, sample_tokens_per_s=10.0)
        later(clock, 2.0, holder["spot"].hang)
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.deaths == 1


def test_step_with_nobody_able_to_serve_fails_with_the_missing_samples_after_the_idle_timeout():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "spot-0", version=None, capacity=8)
        with pytest.raises(StepFailed) as info:
            await run_step(svc, clock, 0, GROUPS, 0)
        return info.value, clock.now()
    (err, when), _ = scenario(body, cfg=config(idle_timeout_s=5.0))
    assert set(err.missing) == {s for g in GROUPS for s in g.sample_ids}
    assert "no token arrived" in str(err) and when < 10.0


def test_step_fails_when_a_sample_exceeds_its_retry_budget():
    holder = {}

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        holder["spot"] = add_instance(svc, clock, log, "spot-0", capacity=16, sample_tokens_per_s=10.0)
        later(clock, 2.0, holder["spot"].kill)
        with pytest.raises(StepFailed) as info:
            await run_step(svc, clock, 0, GROUPS, 0)
        return info.value
    err, log = scenario(body, cfg=config(router=RouterConfig(retry_budget=0)))
    on_dead = {i for e in log if e.instance == "spot-0" and e.method == "submit" for i in e.ids}
    assert "retry_budget=0" in str(err) and set(err.missing) & on_dead


def test_api_misuse_raises_clear_errors():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved")
        with pytest.raises(RolloutError, match="start_step"):
            await svc.next_microbatch(1.0)
        svc.start_step(0, GROUPS, 0)
        with pytest.raises(RolloutError, match="end_step"):
            svc.start_step(1, GROUPS, 0)
        with pytest.raises(RolloutError, match="end the running step"):
            svc.set_weight_version(1)
        await svc.end_step()
        with pytest.raises(ValueError, match="already registered"):
            add_instance(svc, clock, log, "reserved-0", "reserved")
    scenario(body)


def test_with_kv_migration_pages_go_engine_to_engine_never_through_the_controller():
    adapters = []

    async def body(svc, clock, log):
        for name, kind, cap in (("reserved-0", "reserved", 16), ("spot-0", "preemptible", 8),
                                ("spot-1", "preemptible", 8)):
            adapters.append(add_instance(svc, clock, log, name, kind, capacity=cap, handoff=True,
                                         sample_tokens_per_s=10.0))
        later(clock, 2.0, lambda: svc.notice("spot-0", 0.0))
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body, cfg=config(migrate_with_kv=True))
    assert outputs(batches) == uninterrupted(GROUPS)
    exported = next(e for e in log if e.instance == "spot-0" and e.method == "export" and e.t >= 2.0)
    imports = [e for e in log if e.method == "import" and e.t >= exported.t and set(e.ids) & set(exported.ids)]
    assert imports and imports[0].instance == "spot-1"
    assert metrics.migrations >= len(exported.ids) and metrics.kv_migrations >= len(imports[0].ids)
    assert sum(a.kv_bytes for a in adapters) == 0  # only tickets and token-only states reached it
    assert [e for e in log if e.instance == "spot-0" and e.method == "release"]  # its pages were let go


def test_kv_pages_go_only_to_instances_whose_layout_fits():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, handoff=True, sample_tokens_per_s=10.0)
        add_instance(svc, clock, log, "spot-0", capacity=16, sample_tokens_per_s=10.0)  # declares no layout
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body, cfg=config(migrate_with_kv=True))
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.migrations > 0 and metrics.kv_migrations == 0  # moved by re-prefill instead
    assert not [e for e in log if e.instance == "spot-0" and e.method == "import"]
    assert metrics.deaths == 0


def test_deregistered_instance_is_lost_and_its_samples_resume():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=10.0)
        add_instance(svc, clock, log, "spot-1", capacity=8, sample_tokens_per_s=10.0)
        later(clock, 2.0, lambda: svc.deregister("spot-0"))
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body)
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.deaths == 1
    assert not [e for e in log if e.instance == "spot-0" and e.t > 2.0 and e.method != "poll"]


def test_a_crashed_loop_is_reported_to_callers_instead_of_leaving_them_waiting():
    async def body(svc, clock, log):
        def broken():
            raise RuntimeError("registry bug")
        svc.registry.expire = broken  # a bug inside the loop, outside any step
        await clock.asleep(1.0)
        with pytest.raises(RolloutError, match="loop stopped"):
            svc.start_step(0, GROUPS, 0)
    scenario(body)


def test_a_weight_pull_before_activation_is_not_mistaken_for_slow_decoding():
    groups = make_groups(0, num_groups=4, group_size=4, prompt_len=4, max_new_tokens=400)
    seen = []

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=8, sample_tokens_per_s=30.0)
        late = add_instance(svc, clock, log, "spot-late", capacity=8, version=None, sample_tokens_per_s=30.0)
        await clock.asleep(60.0)  # pulling weights for a minute
        late.engine.load_weights({}, 0)
        svc.start_step(0, groups, 0)
        for _ in range(40):
            await clock.asleep(0.1)
            seen.append(next(s.tokens_per_s for s in svc.instances() if s.instance_id == "spot-late"))
        await svc.end_step()
    cfg = config(sample_tokens_per_s=30.0, idle_timeout_s=200.0, registry=RegistryConfig(heartbeat_interval_s=100.0))
    scenario(body, cfg=cfg, policy=window(1000.0))
    # 8 samples at 30 tokens/s each: the estimate must stay near 240, not count the minute of pulling
    assert min(seen) > 0.8 * 240


class ExportLosesOneThenDiesForTests(RecordingEngineForTests):
    """Drained on a notice: its export leaves out one sample (as if it had just finished), and
    the engine dies right after, so the poll that should deliver that sample fails."""

    async def export_states(self, sample_ids, *, with_kv):
        batch = await super().export_states(sample_ids, with_kv=with_kv)
        self.kill()
        return MigrationBatch(states=batch.states[1:])


def test_a_sample_lost_during_a_drain_spends_one_retry_not_two():
    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
        engine = EmulatedEngine(engine_config(max_running=8, sample_tokens_per_s=10.0), clock=clock)
        engine.load_weights({}, 0)
        svc.register(InstanceInfo(instance_id="spot-0", kind="preemptible", capacity=8),
                     ExportLosesOneThenDiesForTests("spot-0", engine, log, clock))
        add_instance(svc, clock, log, "spot-1", capacity=8, sample_tokens_per_s=10.0)
        later(clock, 2.0, lambda: svc.notice("spot-0", 0.0))
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body, cfg=config(router=RouterConfig(retry_budget=1)))
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.deaths == 1 and metrics.resumes >= 1
