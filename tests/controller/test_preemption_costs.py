"""What preemptions alone cost, apart from the controller's other moves: the samples a notice's
drain or a death took off their instance, the prompt and tokens their next placement prefilled
again, and the model tokens a restart from the prompt discarded. A window handover re-prefills
too, but is no preemption."""

from controller_fakes import add_instance, outputs, run_step, uninterrupted

from rlboost.controller.collector import Collector
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import ReferenceWindowConfig, ReferenceWindowRule
from rlboost.controller.records import PromptGroup
from rlboost.controller.registry import RegistryConfig
from rlboost.migration.state import SamplingParams
from rlboost.rollout.engine import TokenDelta
from rlboost.sim import make_groups

PROMPT = 4
GROUPS = make_groups(0, num_groups=4, group_size=4, prompt_len=PROMPT, max_new_tokens=60)


def config(**kw):
    return ControllerConfig(poll_interval_s=0.1, idle_timeout_s=20.0, call_timeout_s=1.0,
                            registry=RegistryConfig(heartbeat_interval_s=1.0, missed_beats=3, drain_margin_s=2.0), **kw)


def run(body, cfg):
    from controller_fakes import run_service
    return run_service(body, cfg, ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=1.0, floor_s=0.0)))


def at(clock, seconds, fn):
    import asyncio

    async def go():
        await clock.asleep(seconds)
        fn()
    return asyncio.ensure_future(go())


def fleet(svc, clock, log):
    add_instance(svc, clock, log, "reserved-0", "reserved", capacity=16, sample_tokens_per_s=10.0)
    spot = add_instance(svc, clock, log, "spot-0", capacity=8, sample_tokens_per_s=10.0)
    add_instance(svc, clock, log, "spot-1", capacity=8, sample_tokens_per_s=10.0)
    return spot


def first_submits_after(log, t, sids):
    """sample -> output tokens it held at its first submit after t."""
    out = {}
    for e in log:
        if e.method == "submit" and e.t >= t:
            for sid, held in zip(e.ids, e.progress):
                if sid in sids:
                    out.setdefault(sid, held)
    return out


def test_a_window_handover_reprefills_but_is_charged_to_no_preemption():
    async def body(svc, clock, log):
        fleet(svc, clock, log)
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), _ = run(body, config())
    assert outputs(batches) == uninterrupted(GROUPS)
    assert metrics.reprefill_tokens > 0  # the reserved engine's samples moved at the window's close
    assert (metrics.preempted_samples, metrics.preempted_reprefill_tokens, metrics.preempted_regenerated_tokens) \
        == (0, 0, 0)


def test_a_death_is_charged_the_reprefill_of_the_samples_it_moved_and_nothing_else():
    seen = {}

    async def body(svc, clock, log):
        spot = fleet(svc, clock, log)

        def kill():
            seen["held"], seen["t"] = set(svc.router.samples_on("spot-0")), clock.now()
            spot.kill()
        at(clock, 2.5, kill)
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = run(body, config())
    assert outputs(batches) == uninterrupted(GROUPS)
    held = seen["held"]
    assert held and metrics.deaths == 1 and metrics.preempted_samples == len(held)
    resumed = first_submits_after(log, seen["t"], held)
    assert set(resumed) == held
    assert metrics.preempted_reprefill_tokens == sum(PROMPT + n for n in resumed.values() if n)
    assert 0 < metrics.preempted_reprefill_tokens < metrics.reprefill_tokens  # the handover's are not its
    assert metrics.preempted_regenerated_tokens == 0  # resumed from the last collected token


def test_a_notice_is_charged_the_reprefill_of_the_samples_its_drain_moved():
    async def body(svc, clock, log):
        fleet(svc, clock, log)
        at(clock, 2.0, lambda: svc.notice("spot-0", 3.0))
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = run(body, config())
    assert outputs(batches) == uninterrupted(GROUPS)
    drain = next(e for e in log if e.instance == "spot-0" and e.method == "export" and e.t >= 2.0)
    resumed = first_submits_after(log, drain.t, set(drain.ids))
    assert resumed and metrics.preemptions == 1 and metrics.deaths == 0
    assert metrics.preempted_samples == len(resumed)
    assert metrics.preempted_reprefill_tokens == sum(PROMPT + n for n in resumed.values() if n) > 0


def test_a_restart_from_the_prompt_is_charged_the_tokens_it_discards_and_no_reprefill():
    seen = {}

    async def body(svc, clock, log):
        spot = fleet(svc, clock, log)

        def kill():
            col = svc.steps.current.collector
            seen["held"] = {s: col.progress(s) for s in svc.router.samples_on("spot-0")}
            spot.kill()
        at(clock, 2.5, kill)
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), _ = run(body, config(migration="recompute"))
    assert outputs(batches) == uninterrupted(GROUPS)  # the same tokens, generated twice
    held = seen["held"]
    assert sum(held.values()) > 0 and metrics.preempted_samples == len(held)
    assert metrics.preempted_regenerated_tokens == sum(held.values())
    assert metrics.trimmed_tokens >= metrics.preempted_regenerated_tokens
    assert metrics.preempted_reprefill_tokens == 0


def _episode() -> Collector:
    group = PromptGroup(group_id=0, prompt_ids=(1, 2), params=SamplingParams(max_new_tokens=32, stop_token_ids=(9,)),
                        num_samples=1, seed=5)
    return Collector(0, [group], 0, microbatch_min_samples=1, episodes=True)


def _delta(start, ids, finish=None):
    return TokenDelta(sample_id=0, start=start, ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids),
                      finish_reason=finish, weight_version=0)


def test_an_episode_restarted_from_its_prompt_gives_back_only_the_tokens_the_model_wrote():
    col = _episode()
    col.apply(_delta(0, [3, 9], "stop"))
    col.take_turn_ends()
    col.observe(0, (7, 7, 7), done=False)
    col.apply(_delta(5, [5, 6]))
    assert (col.model_tokens(0), col.tokens) == (4, 4)  # the observation is not the model's
    assert col.trim(0, 0) == 7 and col.tokens == 0 and col.model_tokens(0) == 0
