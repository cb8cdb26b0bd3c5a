"""`rlboost train --recipe tiny_vllm_cpu` end to end on a real vLLM (its CPU build): every
instance a vLLM engine that pulls each version through the transfer core, one preemption
with notice and one sudden death, and every sample trained on once, from its step's version,
the preempted ones resumed on another vLLM engine by re-prefill.

Run with `-m vllm` where a CPU build of vLLM is installed (.ci/run)."""

from __future__ import annotations

import json
import math

import pytest
from cli_runs import jsonl, train

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

SHORT = ["--recipe", "tiny_vllm_cpu",
         "--set", "run.steps=3", "--set", "run.progress=false", "--set", "run.checkpoint_every=10",
         "--set", "model.warmup_steps=10", "--set", "task.groups_per_step=8", "--set", "task.group_size=4",
         "--set", "trainer.microbatch_groups=2", "--set", "rollout.capacity=8",
         "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=2",
         "--set", "cluster.initial_preemptible=2", "--set", "cluster.inject=notice@2,kill@3",
         "--set", "cluster.notice_s=3"]
SAMPLES_PER_STEP = 8 * 4


def test_a_short_run_on_vllm_survives_a_notice_and_a_sudden_death(tmp_path):
    run = train(tmp_path, SHORT)
    config = json.loads((run / "config.json").read_text())
    assert config["rollout"]["backend"] == "vllm" and config["rollout"]["vllm"]["device"] == "cpu"

    metrics = jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == SAMPLES_PER_STEP
        assert m["duplicates"] == 0 and m["gaps"] == 0
        assert m["weight_version"] == m["step"] and m["sample_versions"] == [m["step"]]
        assert math.isfinite(m["reward_mean"]) and m["tokens_per_s"] > 0
    events = jsonl(run / "events.jsonl")
    kinds = [(e["kind"], e.get("instance")) for e in events]
    assert ("notice", "spot-s0") in kinds and ("gone", "spot-s0") in kinds
    deaths = [e for e in events if e["kind"] == "death"]
    assert [e["instance"] for e in deaths] == ["spot-s1"]
    assert any(("first_sample", i) in kinds for i in ("spot-s0", "spot-s1"))  # preemptible vLLM engines rolled out
    summary = (run / "summary.md").read_text()
    assert "| samples lost | 0 |" in summary and "| samples duplicated | 0 |" in summary
    assert "1 with notice, 1 sudden" in summary
