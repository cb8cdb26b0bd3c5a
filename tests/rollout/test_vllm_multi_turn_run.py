"""Multi-turn episodes on a real vLLM (its CPU build): `rlboost train --recipe
tiny_calculator_cpu` with every instance a vLLM engine, one preemption with notice and one
sudden death. Every episode is trained on once, from its step's version, and every tool call
the model made ran exactly once on the environment host (its execution counter equals the
turns of the trained episodes at every step).

Run with `-m vllm` where a CPU build of vLLM is installed (.ci/run)."""

from __future__ import annotations

import json

import pytest
from cli_runs import jsonl, train

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

GROUPS, GROUP_SIZE = 8, 4
SHORT = ["--recipe", "tiny_calculator_cpu", "--set", "rollout.backend=vllm",
         "--set", "rollout.vllm.device=cpu", "--set", "rollout.vllm.dtype=float32",
         "--set", "rollout.vllm.stream_interval=4", "--set", f"rollout.vllm.kv_cache_bytes={64 << 20}",
         "--set", "model.head_dim=32",  # a head size vLLM's CPU attention takes
         "--set", "model.warmup_steps=40", "--set", "run.steps=3", "--set", "run.progress=false",
         "--set", "run.checkpoint_every=10", "--set", f"task.groups_per_step={GROUPS}",
         "--set", f"task.group_size={GROUP_SIZE}", "--set", "trainer.microbatch_groups=2",
         "--set", "rollout.capacity=8", "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=2",
         "--set", "cluster.initial_preemptible=2", "--set", "cluster.inject=notice@2,kill@3",
         "--set", "cluster.notice_s=3", "--set", "cluster.preempt_busy_wait_s=120"]


def test_calculator_episodes_on_vllm_survive_a_notice_and_a_sudden_death_with_each_call_run_once(tmp_path):
    run = train(tmp_path, SHORT)
    config = json.loads((run / "config.json").read_text())
    assert config["rollout"]["backend"] == "vllm" and config["environment"]["name"] == "calculator"

    metrics = jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    turns = 0
    for m in metrics:
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == m["episodes"] == GROUPS * GROUP_SIZE
        assert m["duplicates"] == 0 and m["gaps"] == 0 and m["sample_versions"] == [m["step"]]
        turns += round(m["turns_mean"] * m["episodes"])
        assert m["environment_executions"] == turns, (m["step"], m["environment_executions"], turns)
    assert turns > sum(m["episodes"] for m in metrics), "no episode called the tool"
    kinds = [(e["kind"], e.get("instance")) for e in jsonl(run / "events.jsonl")]
    assert ("notice", "spot-s0") in kinds and ("death", "spot-s1") in kinds
    summary = (run / "summary.md").read_text()
    assert "| samples lost | 0 |" in summary and "| samples duplicated | 0 |" in summary
