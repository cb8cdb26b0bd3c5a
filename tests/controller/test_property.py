"""Property: under any schedule of joins, notices, deaths and slowdowns, every sample of every
step completes exactly once with the tokens an uninterrupted run produces, and no step hangs.
Checked with the emulated engine on virtual time and with the embedded torch engine on real time."""

import asyncio
import time

import pytest
import torch
from controller_fakes import engine_config, outputs, uninterrupted
from fleet_schedules import fleet_schedules, real_engine_spots
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from steps import take_step

from rlboost.controller.clock import MonotonicClock, run_virtual
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import AdaptiveWindow, AdaptiveWindowConfig, ReferenceWindowConfig, ReferenceWindowRule
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import RouterConfig
from rlboost.controller.service import RolloutService
from rlboost.models import build_tiny_checkpoint
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.sim import EmulatedFleet, SimInstance, make_groups

WATCHDOG_S = 5000.0  # virtual seconds; a schedule taking longer is a hang


@st.composite
def instance_specs(draw, name, kind="preemptible"):
    return SimInstance(
        instance_id=name, kind=kind, pull_s=0.0 if kind == "reserved" else draw(st.floats(0.0, 3.0)),
        engine=engine_config(max_running=draw(st.integers(1, 3 if kind == "reserved" else 8)),
                             sample_tokens_per_s=draw(st.floats(2.0, 40.0)),
                             decode_tokens_per_s=draw(st.floats(10.0, 200.0))))


def schedules():
    return fleet_schedules(instance_specs, initial=(0, 3), events=(0, 10), horizon_s=6.0, grace_s=12.0,
                           speed_factor=(0.1, 3.0))


def losses(events) -> int:
    """How many instances a schedule can take away: the most times any one sample can lose
    its instance, so a budget of exactly that must never run out (no loss is charged twice,
    and a refusal is no loss)."""
    return len({e.instance_id for e in events if e.kind in ("death", "notice")})


def run_schedule(reserved, initial, events, policy, shape, steps=2):
    groups_for = {s: make_groups(s, **shape) for s in range(steps)}

    async def main(clock):
        cfg = ControllerConfig(poll_interval_s=0.1, idle_timeout_s=60.0, call_timeout_s=2.0,
                               router=RouterConfig(retry_budget=losses(events), min_steal_gain_s=0.5),
                               registry=RegistryConfig(heartbeat_interval_s=0.5, drain_margin_s=1.0))
        svc = RolloutService(cfg, clock=clock, window_policy=policy)
        await svc.start()
        fleet = EmulatedFleet(svc, clock)
        fleet.spawn(reserved)
        for spec in initial:
            fleet.spawn(spec)
        fleet.schedule(events)
        results = []
        try:
            for step in range(steps):
                svc.set_weight_version(step)
                svc.start_step(step, groups_for[step], step)
                results.append(await take_step(svc))
        finally:
            await fleet.close()
            await svc.close()
        return results

    async def guarded(clock):
        return await asyncio.wait_for(main(clock), WATCHDOG_S)
    return groups_for, run_virtual(guarded)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reserved=instance_specs("reserved-0", kind="reserved"), schedule=schedules(),
       adaptive=st.booleans(), window_s=st.floats(0.0, 6.0),
       shape=st.fixed_dictionaries(dict(num_groups=st.integers(1, 6), group_size=st.integers(1, 4),
                                        prompt_len=st.integers(1, 6), max_new_tokens=st.integers(1, 60),
                                        seed=st.integers(0, 2 ** 32))))
def test_every_sample_completes_exactly_once_with_uninterrupted_tokens(reserved, schedule, adaptive,
                                                                       window_s, shape):
    initial, events = schedule
    policy = (AdaptiveWindow(AdaptiveWindowConfig(initial_window_s=window_s)) if adaptive
              else ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=window_s, floor_s=0.0)))
    groups_for, results = run_schedule(reserved, initial, events, policy, shape)
    for step, (batches, metrics) in enumerate(results):
        assert outputs(batches) == uninterrupted(groups_for[step], version=step)
        assert all(s.weight_version == step for mb in batches for g in mb.groups for s in g.samples)
        assert metrics.samples == sum(g.num_samples for g in groups_for[step])
        assert metrics.gaps == 0
        assert [mb.last for mb in batches].count(True) == 1


# -- the same property with the embedded torch engine, on real time ------------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models run fastest on one thread; engine threads share the pool
    yield str(build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), arch="qwen3", seed=0))
    torch.set_num_threads(before)


def embedded_reference(model_dir, groups):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_dir=model_dir, num_blocks=512, max_batch_size=64))
    try:
        states = [s for g in groups for s in g.states(0)]
        engine.submit(states)
        out, deadline = {}, time.monotonic() + 60.0
        while sum(1 for v in out.values() if v[2]) < len(states):
            assert time.monotonic() < deadline, "reference run did not finish"
            for d in engine.poll(1.0):
                ids, lps, _ = out.get(d.sample_id, ((), (), None))
                out[d.sample_id] = (ids + d.ids, lps + d.logprobs, d.finish_reason)
        return out
    finally:
        engine.close()


def real_time_schedules():
    return fleet_schedules(real_engine_spots, initial=(0, 2), events=(1, 4), horizon_s=0.1, grace_s=0.2)


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(schedule=real_time_schedules(), window_s=st.floats(0.0, 0.2),
       shape=st.fixed_dictionaries(dict(num_groups=st.integers(1, 3), group_size=st.integers(1, 3),
                                        prompt_len=st.integers(1, 8), max_new_tokens=st.integers(40, 120),
                                        seed=st.integers(0, 2 ** 32))))
def test_embedded_engine_samples_complete_exactly_once_under_preemption(tiny_model, schedule, window_s, shape):
    initial, events = schedule
    groups = make_groups(0, stop_token_ids=(7,), **shape)

    def make_engine(spec):
        return EmbeddedEngine(EmbeddedEngineConfig(model_dir=tiny_model, stream_interval=2, num_blocks=256,
                                                   max_batch_size=spec.capacity))

    async def main():
        clock = MonotonicClock()
        cfg = ControllerConfig(poll_interval_s=0.01, idle_timeout_s=20.0, call_timeout_s=10.0,
                               router=RouterConfig(retry_budget=losses(events), min_steal_gain_s=0.05),
                               registry=RegistryConfig(heartbeat_interval_s=0.05, missed_beats=20,
                                                       drain_margin_s=0.05))
        svc = RolloutService(cfg, clock=clock,
                             window_policy=AdaptiveWindow(AdaptiveWindowConfig(initial_window_s=window_s)))
        await svc.start()
        fleet = EmulatedFleet(svc, clock, make_engine=make_engine)
        try:
            fleet.spawn(SimInstance(instance_id="reserved-0", kind="reserved", pull_s=0.0, capacity=4))
            for spec in initial:
                fleet.spawn(spec)
            fleet.schedule(events)
            svc.start_step(0, groups, 0)
            return await take_step(svc, 5.0)
        finally:
            await fleet.close()
            await svc.close()

    batches, metrics = asyncio.run(asyncio.wait_for(main(), 60.0))  # a hang fails loudly
    got, want = outputs(batches), embedded_reference(tiny_model, groups)
    assert got.keys() == want.keys()
    for sid, (ids, lps, finish) in want.items():
        assert got[sid][0] == ids and got[sid][2] == finish
        assert got[sid][1] == pytest.approx(lps, abs=1e-4)
    assert metrics.gaps == 0
