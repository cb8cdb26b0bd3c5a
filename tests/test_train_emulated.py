"""`rlboost train` with rollout.backend=emulated (engines that take a GPU's time and emit
hash tokens, under the real controller, weight pulls, preemptions and trainer) and
controller.max_staleness 1 and 2 (the driver keeps that many later steps in flight): through a
preemption with notice and a sudden one, every sample is trained on exactly once and every
trained token is within the bound. The
strictly on-policy emulated runs: tests/cluster/test_egress_run.py, test_live_capacity.py,
tests/test_two_nodes.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

MAX_NEW = 24
GROUPS, GROUP_SIZE = 8, 4
ARGS = [
    "--set", "run.steps=3", "--set", "run.progress=false", "--set", "run.checkpoint_every=10",
    "--set", "model.warmup_steps=10", "--set", f"task.groups_per_step={GROUPS}",
    "--set", f"task.group_size={GROUP_SIZE}", "--set", f"task.max_new_tokens={MAX_NEW}",
    "--set", "trainer.microbatch_groups=2", "--set", "rollout.capacity=16",
    "--set", "rollout.backend=emulated", "--set", "rollout.emulated.decode_tokens_per_s=400",
    "--set", "rollout.emulated.sample_tokens_per_s=40", "--set", "rollout.emulated.stop_probability=0.05",
    "--set", "rollout.emulated_preemptible_speed=0.5",
    "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1",
    "--set", "cluster.inject=notice@2", "--set", "cluster.notice_s=3",
    "--set", "trainer.world_size=1",  # one trainer rank: nothing here depends on the rank count (two ranks: test_train_cli, test_supervision)
]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("bound", [1, 2])
def test_bounded_staleness_run_trains_every_sample_once_through_notice_and_sudden_preemptions(tmp_path, bound):
    # the session's RLBOOST_CACHE (tests/conftest.py): both bounds start from the one tiny checkpoint
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    args = [a.replace("run.steps=3", "run.steps=4").replace("max_preemptible=1", "max_preemptible=2")
            .replace("initial_preemptible=1", "initial_preemptible=2").replace("notice@2", "notice@2,kill@3")
            for a in ARGS]
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *args,
                           "--set", f"controller.max_staleness={bound}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    run = Path(proc.stdout.strip().splitlines()[-1])
    metrics = _jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == GROUPS * GROUP_SIZE
        assert m["duplicates"] == 0 and m["gaps"] == 0
        assert set(m["sample_versions"]) <= set(range(m["step"] - bound, m["step"] + 1))  # within the bound
        assert sum(m["staleness_tokens"]) == m["response_tokens"] and len(m["staleness_tokens"]) == bound + 1
        assert m["largest_lag"] <= bound
        assert math.isfinite(m["is_weight_mean"]) and 0.0 <= m["is_truncated_share"] <= 1.0
    assert any(m["staleness_tokens"][1] > 0 for m in metrics[1:])  # the next step did start ahead
    kinds = [(e["kind"], e.get("instance")) for e in _jsonl(run / "events.jsonl")]
    assert any(k == "notice" for k, _ in kinds) and any(k == "death" for k, _ in kinds)  # notice and sudden
    assert "| samples lost | 0 |" in (run / "summary.md").read_text()
    assert (run / "plots" / "staleness.png").is_file()
