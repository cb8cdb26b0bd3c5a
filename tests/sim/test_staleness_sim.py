"""Bounded staleness in the simulator (controller.max_staleness >= 1): runs finish, every
sample is collected exactly once through preemptions, and every trained token comes from a
weight version within the bound (controller.staleness's window), as each sample's version
change points record it; a token outside the window is refused."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost.controller.staleness import accepted_versions, token_versions
from rlboost.errors import StaleSampleError
from rlboost.recipes.paper_qwen3_8b import PROMPT_TOKENS, paper_qwen3_8b
from rlboost.sim.collector import SimCollector, SimGroup
from rlboost.sim.lags import count_lags
from rlboost.sim.metrics import summarize
from rlboost.sim.report import step_record
from rlboost.sim.simulator import Simulator
from rlboost.sim.spec import SimSpec
from rlboost.sim.workload import sim_groups


def _spec(n: int, *, staleness: int, groups: int = 16, steps: int = 6, trace: str = "none", sudden: float = 0.0,
          seed: int = 0) -> SimSpec:
    c = paper_qwen3_8b()
    c = dataclasses.replace(
        c, task=dataclasses.replace(c.task, groups_per_step=groups),
        controller=dataclasses.replace(c.controller, max_staleness=staleness),
        cluster=dataclasses.replace(c.cluster, max_preemptible=n, initial_preemptible=0 if trace != "none" else n,
                                    trace=trace, sudden_fraction=sudden, seed=seed,
                                    trace_duration_s=60.0 if trace != "none" else None))
    return SimSpec.of(c, prompt_tokens=PROMPT_TOKENS, steps=steps)


def _expected_tokens(spec: SimSpec, step: int) -> int:
    groups = sim_groups(step, num_groups=spec.groups_per_step, group_size=spec.group_size,
                        prompt_len=spec.prompt_tokens, max_new_tokens=spec.max_new_tokens,
                        engine=spec.rollout.emulated, seed=spec.seed)
    return sum(sum(g.lengths) for g in groups)


def _run_recording(spec: SimSpec):
    """Run the simulation; return it and every trained sample's (step, changes, covered, length)."""
    sim = Simulator(spec)
    trained, seen = sim.ctl.trained, []

    def record(batch):
        col = sim.ctl.st.collector
        for gid, _ in batch.groups:
            for sid in col.group_samples(gid):
                seen.append((sim.ctl.st.meter.step, sid, *col.changes(sid), col.length(sid)))
        trained(batch)
    sim.ctl.trained = record
    return sim.run(), seen


def _check(spec: SimSpec, result, seen) -> None:
    n = spec.controller.max_staleness
    assert [s.metrics.step for s in result.steps] == list(range(1, spec.steps + 1))
    for rec in result.steps:
        assert rec.metrics.total_tokens == _expected_tokens(spec, rec.metrics.step)
        assert rec.metrics.duplicates == 0 and rec.metrics.gaps == 0
        assert sum(rec.staleness) == rec.metrics.total_tokens and len(rec.staleness) == n + 1
    per_step = Counter(step for step, *_ in seen)
    assert all(per_step[s] == spec.groups_per_step * spec.group_size for s in range(1, spec.steps + 1))
    assert len({sid for _, sid, *_ in seen}) == len(seen)  # no sample trained twice
    for step, sid, changes, covered, length in seen:
        assert covered == length  # every token has its version
        assert set(token_versions(changes, length)) <= set(accepted_versions(step, n)), (sid, changes)


def test_a_staleness_1_run_finishes_within_the_bound():
    spec = _spec(4, staleness=1)
    result, seen = _run_recording(spec)
    _check(spec, result, seen)
    assert sum(s.staleness[1] for s in result.steps) > 0  # instances generated across step boundaries
    assert any(len(changes) > 1 for _, _, changes, _, _ in seen)  # samples took a new version mid-way
    record = step_record(result.steps[-1], spec.time_scale, spec.token_block)
    assert sum(record["staleness_tokens"]) == record["generated_tokens"]
    summary = summarize(result).as_dict()
    assert len(summary["staleness_tokens"]) == 2 and 0 < summary["stale_share"] < 1


@pytest.mark.parametrize("sudden", [0.0, 1.0])
def test_no_sample_is_lost_or_duplicated_through_preemptions(sudden):
    spec = _spec(4, staleness=1, trace="skypilot-sample", sudden=sudden, steps=10)
    result, seen = _run_recording(spec)
    _check(spec, result, seen)
    assert result.preemptions["sudden" if sudden else "notice"] > 0


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(staleness=st.integers(1, 2), sudden=st.sampled_from([0.0, 0.5, 1.0]), seed=st.integers(0, 1000),
       trace=st.sampled_from(["skypilot-sample", "aws-spot-4node"]))
def test_every_trained_token_is_within_the_bound_under_random_preemptions(staleness, sudden, seed, trace):
    spec = _spec(4, staleness=staleness, groups=8, steps=5, trace=trace, sudden=sudden, seed=seed)
    result, seen = _run_recording(spec)
    _check(spec, result, seen)


def test_a_token_outside_the_window_is_refused():
    col = SimCollector([SimGroup(group_id=7, sample_ids=(70, 71), prompt_len=2, lengths=(3, 3), max_new=4)],
                       min_samples=2)
    col.version_changed(70, 1)  # made by version 1 ...
    col.finish(70, 1.0)
    col.version_changed(71, 3)
    col.finish(71, 1.0)
    batch = col.take()
    count_lags(col, batch, 3, 2, Counter())  # ... trained at step 3 with max_staleness 2: fine
    with pytest.raises(StaleSampleError, match="sample 70"):
        count_lags(col, batch, 3, 1, Counter())  # with 1: refused
