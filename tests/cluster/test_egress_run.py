"""A run with cost.egress_usd_per_gb set, on emulated engines (a GPU's time, hash tokens)
under the real controller, weight pulls and trainer: every step records the bytes each
instance pulled (a delta once it holds the previous version), the ledger prices what came
from the trainer, and the summary shows those dollars inside tokens per dollar. Emulated
engines through preemptions: tests/test_train_emulated.py (notice and sudden, bounded
staleness), tests/cluster/test_live_capacity.py (notice) and tests/test_two_nodes.py (a
node's death), all strict on-policy but the first."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.run.directory import RunDirectory
from rlboost.run.report import dollars, summarize

USD_PER_GB = 40.0
ARGS = [
    "--set", "run.steps=3", "--set", "run.progress=false", "--set", "run.checkpoint_every=10",
    "--set", "model.warmup_steps=10", "--set", "task.groups_per_step=4", "--set", "task.group_size=4",
    "--set", "task.max_new_tokens=16", "--set", "trainer.microbatch_groups=2", "--set", "rollout.capacity=16",
    "--set", "rollout.backend=emulated", "--set", "rollout.emulated.decode_tokens_per_s=400",
    "--set", "rollout.emulated.sample_tokens_per_s=40", "--set", "rollout.emulated.stop_probability=0.05",
    "--set", "rollout.embedded.dtype=bfloat16",
    "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1",
    "--set", "cluster.inject=", "--set", "trainer.world_size=1",  # one trainer rank: nothing here depends on the rank count (two ranks: test_train_cli, test_supervision)
    "--set",
    f'cost.egress_usd_per_gb={{"reserved": {USD_PER_GB}, "preemptible": {USD_PER_GB}}}',
]


def test_a_run_prices_weight_egress_and_counts_it_in_tokens_per_dollar(tmp_path):
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *ARGS], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    run = Path(proc.stdout.strip().splitlines()[-1])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        # emulated engines under the real controller and trainer: every sample trained once,
        # strictly on-policy; hash tokens earn nothing (equal rewards, zero advantages), and
        # the GRPO step on them stays finite; some samples end early on the end token
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == 4 * 4
        assert m["duplicates"] == 0 and m["gaps"] == 0 and m["sample_versions"] == [m["step"]]
        assert m["reward_mean"] == 0.0 and m["reward_std"] == 0.0
        assert all(math.isfinite(m[k]) for k in ("loss", "grad_norm", "kl", "mean_ratio"))
        assert 4 * 4 <= m["response_tokens"] < 4 * 4 * 16
        assert set(m["weight_bytes_per_instance"]) == {"reserved-0", "spot-s0"}
        assert m["weight_bytes"] == sum(m["weight_bytes_per_instance"].values()) >= m["weight_egress_bytes"] > 0
    # version 1 arrives whole; later ones as deltas against the version each instance holds
    assert metrics[0]["weight_delta_pulls"] == 0
    for m in metrics[1:]:
        assert m["weight_delta_pulls"] == 2 and m["weight_bytes"] < m["weight_version_bytes"]
    egress_bytes = sum(m["weight_egress_bytes"] for m in metrics)
    assert metrics[-1]["egress_usd"] == pytest.approx(egress_bytes / 1e9 * USD_PER_GB)
    s = summarize(RunDirectory(run))
    assert s.egress_bytes == egress_bytes and s.egress_usd == pytest.approx(metrics[-1]["egress_usd"])
    assert s.usd == pytest.approx(metrics[-1]["cost_usd"]) and s.usd > s.egress_usd > 0
    assert s.tokens_per_usd == pytest.approx(s.tokens / s.usd)
    row = dict(s.rows())["weight egress (pulled from the trainer, in tokens per dollar)"]
    assert dollars(s.egress_usd) in row and "4 of 6 pulls took a delta" in row
    assert dollars(s.egress_usd) in (run / "summary.md").read_text()
