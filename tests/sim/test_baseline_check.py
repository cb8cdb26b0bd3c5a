"""`rlboost simulate --calibrate`'s check: the reserved-only prediction beside a measured baseline,
and the factor on every efficiency that would meet it (a what-if: lower efficiency, lower
throughput; a figure above what the measured inputs give at full speed is refused)."""

from __future__ import annotations

import dataclasses

import pytest

from rlboost.recipes.paper_qwen3_8b import PROMPT_TOKENS, paper_qwen3_8b
from rlboost.sim.calibrate import baseline_tokens_per_s, scale_to_meet
from rlboost.sim.spec import SimSpec


def _spec() -> SimSpec:
    c = paper_qwen3_8b()
    c = dataclasses.replace(c, task=dataclasses.replace(c.task, groups_per_step=8))
    return SimSpec.of(c, prompt_tokens=PROMPT_TOKENS, steps=3)


def test_the_factor_that_meets_a_lower_baseline_is_below_one_and_meets_it():
    spec = _spec()
    measured = baseline_tokens_per_s(spec)
    target = 0.8 * measured
    scale = scale_to_meet(spec, target=target, tolerance=0.01)
    assert 0.05 < scale < 1.0
    assert baseline_tokens_per_s(spec, scale) == pytest.approx(target, rel=0.05)


def test_a_baseline_above_the_measured_inputs_is_refused():
    spec = _spec()
    with pytest.raises(ValueError, match="even as measured"):
        scale_to_meet(spec, target=2.0 * baseline_tokens_per_s(spec))
