"""Property: multi-turn episodes on the embedded torch engine, under any schedule of joins,
notices and deaths, end with the trajectories an undisturbed run with the same seeds gives
(every model token, observation and mask), and every turn reaches its environment exactly
once: the environment's own counter, the host's executions and the turns of the
trajectories agree, and the host never had to answer a call twice."""

import asyncio
from pathlib import Path

import pytest
import torch
from fleet_schedules import fleet_schedules, real_engine_spots
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from steps import take_step

from rlboost.controller.clock import MonotonicClock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import AdaptiveWindow, AdaptiveWindowConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import RouterConfig
from rlboost.controller.service import RolloutService
from rlboost.environments.config import EnvironmentConfig
from rlboost.environments.turns import EpisodeHost
from rlboost.models import build_tiny_checkpoint
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.sim import EmulatedFleet, SimInstance, make_groups
from rlboost.tasks.base import Problem

ENV = f"{Path(__file__).with_name('envs_for_tests.py')}:ToolByParityEnvForTests"
STOPS = tuple(range(40, 100))  # about one token in four ends a turn: short turns, several per episode


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield str(build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), arch="qwen3", seed=0))
    torch.set_num_threads(before)


def run_episodes(model_dir, groups, initial=(), events=(), retry_budget=0):
    """The step's delivered samples by id, the host's counters and the environment's (the
    class the host loaded from its path)."""

    def make_engine(spec):
        return EmbeddedEngine(EmbeddedEngineConfig(model_dir=model_dir, stream_interval=2, num_blocks=256,
                                                   max_batch_size=spec.capacity))

    async def main():
        clock = MonotonicClock()
        cfg = ControllerConfig(poll_interval_s=0.01, idle_timeout_s=20.0, call_timeout_s=10.0,
                               router=RouterConfig(retry_budget=retry_budget, min_steal_gain_s=0.05),
                               # an engine that loads slowly on a busy machine is not lost for it: only
                               # the schedule's deaths and notices take instances away
                               registry=RegistryConfig(heartbeat_interval_s=0.05, missed_beats=200,
                                                       drain_margin_s=0.05))
        svc = RolloutService(cfg, clock=clock, window_policy=AdaptiveWindow(AdaptiveWindowConfig(initial_window_s=0.05)))
        host = EpisodeHost(EnvironmentConfig(name=ENV, max_turns=4, workers=2), tokenizer_dir=model_dir)
        host.kind.make.func.STEPS.clear()
        for g in groups:
            await host.open(g.sample_ids, Problem(problem_id=g.group_id, prompt="p", answer=""))
        svc.attach_environments(host)
        await svc.start()
        fleet = EmulatedFleet(svc, clock, make_engine=make_engine)
        try:
            fleet.spawn(SimInstance(instance_id="reserved-0", kind="reserved", pull_s=0.0, capacity=4))
            for spec in initial:
                fleet.spawn(spec)
            fleet.schedule(list(events))
            svc.start_step(0, groups, 0)
            batches, _ = await take_step(svc, 5.0)
            return batches, host.stats(), host.kind.make.func.STEPS["steps"]
        finally:
            await fleet.close()
            await svc.close()
            host.shutdown()

    batches, stats, steps = asyncio.run(asyncio.wait_for(main(), 60.0))  # a hang fails loudly
    samples = {}
    for mb in batches:
        for g in mb.groups:
            for s in g.samples:
                assert s.sample_id not in samples, f"sample {s.sample_id} delivered twice"
                samples[s.sample_id] = s
    return samples, stats, steps


def schedules():
    return fleet_schedules(real_engine_spots, initial=(1, 2), events=(1, 4), horizon_s=0.3, grace_s=0.2)


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(schedule=schedules(), seed=st.integers(0, 2 ** 32),
       shape=st.fixed_dictionaries(dict(num_groups=st.integers(1, 3), group_size=st.integers(1, 3))))
def test_episodes_under_preemption_equal_an_undisturbed_run_and_call_each_turn_once(tiny_model, schedule, seed,
                                                                                      shape):
    initial, events = schedule
    groups = make_groups(0, prompt_len=4, max_new_tokens=48, seed=seed, stop_token_ids=STOPS, **shape)
    calm, calm_stats, calm_steps = run_episodes(tiny_model, groups)
    got, stats, steps = run_episodes(tiny_model, groups, initial, events,
                                     retry_budget=len({e.instance_id for e in events if e.kind != "join"}))
    assert got.keys() == calm.keys() == {sid for g in groups for sid in g.sample_ids}
    for sid, want in calm.items():
        s = got[sid]
        assert (s.output_ids, s.model_mask, s.turns, s.finish_reason) == \
            (want.output_ids, want.model_mask, want.turns, want.finish_reason)
        assert s.output_logprobs == pytest.approx(want.output_logprobs, abs=1e-4)
    turns = sum(s.turns for s in got.values())
    assert steps == stats.executions == turns == calm_steps  # each turn executed exactly once
    assert (stats.replays, stats.joined) == (0, 0)
