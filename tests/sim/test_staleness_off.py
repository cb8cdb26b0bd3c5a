"""max_staleness = 0 changes nothing: short simulated runs (one at 4 instances, one on a trace
with notices and sudden deaths) give, figure for figure, what the simulator gave before the
bounded-staleness mode existed (tests/sim/data/onpolicy_main.json, recorded from it, and
recorded again, with the simulator unchanged, when the timing model's inputs changed; a
lost instance's samples count as resumes only, not as migrations, as the live controller
counts them)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rlboost.recipes.paper_qwen3_8b import PROMPT_TOKENS, paper_qwen3_8b
from rlboost.sim.metrics import summarize
from rlboost.sim.simulator import Simulator
from rlboost.sim.spec import SimSpec

RECORDED = json.loads((Path(__file__).parent / "data" / "onpolicy_main.json").read_text())


def _config(n: int, groups: int, trace: str = "none", sudden: float = 0.0):
    c = paper_qwen3_8b()
    return dataclasses.replace(
        c, task=dataclasses.replace(c.task, groups_per_step=groups),
        cluster=dataclasses.replace(c.cluster, max_preemptible=n, initial_preemptible=0 if trace != "none" else n,
                                    trace=trace, sudden_fraction=sudden,
                                    trace_duration_s=60.0 if trace != "none" else None))


RUNS = {"4inst": (_config(4, 32), 5), "trace": (_config(4, 16, "skypilot-sample", 0.5), 6)}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_strict_on_policy_runs_as_before(name):
    config, steps = RUNS[name]
    assert config.controller.max_staleness == 0
    result = Simulator(SimSpec.of(config, prompt_tokens=PROMPT_TOKENS, steps=steps)).run()
    recorded = RECORDED[name]
    keys = set(recorded["steps"][0])  # fields added to StepMetrics since are not compared
    got = {"summary": summarize(result).as_dict(), "preemptions": result.preemptions,
           "steps": [{k: v for k, v in (dataclasses.asdict(s.metrics) | {"wall_s": s.wall_s, "cost_usd": s.cost_usd})
                      .items() if k in keys} for s in result.steps]}
    assert json.loads(json.dumps(got, sort_keys=True)) == recorded
    assert all(s.staleness == (s.metrics.total_tokens,) for s in result.steps)  # every token at the step's version
