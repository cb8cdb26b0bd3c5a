"""The simulator: every sample of every step is collected exactly once, through preemptions
with and without notice; preemptible instances raise throughput; its decisions are the
controller's own (policy, router, registry); a spec it cannot run is refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from rlboost.controller.offload import AdaptiveWindow, ReferenceWindowRule
from rlboost.controller.registry import Registry
from rlboost.controller.router import Router
from rlboost.recipes.paper_qwen3_8b import PROMPT_TOKENS, paper_qwen3_8b, with_reference_mechanisms
from rlboost.sim.metrics import summarize
from rlboost.sim.simulator import Simulator
from rlboost.sim.spec import SimSpec
from rlboost.sim.workload import sim_groups


def _config(n: int, *, groups: int = 16, trace: str = "none", sudden: float = 0.0):
    c = paper_qwen3_8b()
    return dataclasses.replace(
        c, task=dataclasses.replace(c.task, groups_per_step=groups),
        cluster=dataclasses.replace(c.cluster, max_preemptible=n, initial_preemptible=0 if trace != "none" else n,
                                    trace=trace, sudden_fraction=sudden, trace_duration_s=60.0 if trace != "none"
                                    else None))


def _spec(config, steps: int) -> SimSpec:
    return SimSpec.of(config, prompt_tokens=PROMPT_TOKENS, steps=steps)


def _expected_tokens(spec: SimSpec, step: int) -> int:
    groups = sim_groups(step, num_groups=spec.groups_per_step, group_size=spec.group_size,
                        prompt_len=spec.prompt_tokens, max_new_tokens=spec.max_new_tokens,
                        engine=spec.rollout.emulated, seed=spec.seed)
    return sum(sum(g.lengths) for g in groups)


@pytest.mark.parametrize("sudden", [0.0, 1.0])
def test_every_sample_is_collected_once_through_preemptions(sudden):
    spec = _spec(_config(4, trace="skypilot-sample", sudden=sudden), steps=10)
    result = Simulator(spec).run()
    assert [s.metrics.step for s in result.steps] == list(range(1, 11))
    for rec in result.steps:
        assert rec.metrics.total_tokens == _expected_tokens(spec, rec.metrics.step)
        assert rec.metrics.duplicates == 0
    assert sum(result.preemptions.values()) > 0
    kind = "sudden" if sudden else "notice"
    assert result.preemptions[kind] == sum(result.preemptions.values())
    assert sum(s.metrics.deaths for s in result.steps) > 0 if sudden else True
    assert result.steps[-1].cost_usd > result.steps[-1].reserved_usd  # preemptible instances were billed


def test_preemptible_instances_raise_throughput():
    rates = [summarize(Simulator(_spec(_config(n, groups=128), steps=5)).run()).tokens_per_s for n in (0, 4)]
    assert rates[1] > 1.2 * rates[0]


def test_the_decisions_are_the_controllers_own():
    sim = Simulator(_spec(_config(2), steps=1))
    assert isinstance(sim.ctl.policy, AdaptiveWindow)
    assert isinstance(sim.ctl.registry, Registry) and isinstance(sim.ctl.router, Router)
    ref = Simulator(_spec(with_reference_mechanisms(_config(2)), steps=1))
    assert isinstance(ref.ctl.policy, ReferenceWindowRule)
    assert ref.link.relay is False


def test_a_spec_the_simulator_cannot_run_is_refused():
    c = _config(1)
    with pytest.raises(ValueError, match="rollout.emulated.model"):
        _spec(dataclasses.replace(c, rollout=dataclasses.replace(
            c.rollout, emulated=dataclasses.replace(c.rollout.emulated, model=""))), steps=2)
    with pytest.raises(ValueError, match="time_scale"):
        _spec(dataclasses.replace(c, cost=dataclasses.replace(c.cost, time_scale=1.0)), steps=2)
    with pytest.raises(ValueError, match="egress_bytes_per_s"):
        Simulator(_spec(dataclasses.replace(c, transfer=dataclasses.replace(c.transfer, publisher=dataclasses.replace(c.transfer.publisher, egress_bytes_per_s=None))),
                        steps=2))
