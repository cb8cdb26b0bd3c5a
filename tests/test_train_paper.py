"""`rlboost train --recipe paper_qwen3_8b`: the artifact's setup at its proportions, emulated: the
emulated trainer (one actor for the node's 8 GPUs) trains on every sample of every step, and
its published payload is what the instances pull."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ARGS = ["--recipe", "paper_qwen3_8b", "--set", "run.steps=2", "--set", "run.progress=false",
        "--set", "task.groups_per_step=8", "--set", "cluster.initial_preemptible=2", "--set", "cluster.max_preemptible=2"]


@pytest.mark.slow
def test_the_paper_recipe_trains_with_the_emulated_trainer(tmp_path):
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    env.pop("RLBOOST_SET", None)
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *ARGS], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    run = Path(proc.stdout.strip().splitlines()[-1])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == 64
        assert m["duplicates"] == 0 and m["gaps"] == 0
        assert m["publish_bytes"] > 2**20  # the scaled payload, not a tiny model's weights
    config = json.loads((run / "config.json").read_text())
    assert config["rollout"]["emulated"]["model"] == "qwen3-8b"
    assert config["cost"]["time_scale"] == config["rollout"]["emulated"]["time_scale"]
