"""`rlboost train` with a reward function from a user's own module (outside the package):
it returns a dict with named parts, raises on about 10% of samples and sleeps past the
timeout on about 5%. The run completes; the failures are counted per step in metrics.jsonl
and in the summary, and the parts are logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

USER_MODULE = textwrap.dedent('''
    """A user's reward: correct answers earn 1, a clean number 0.1 more. Of every 20 samples
    of a step (by their place in it) 2 raise and 1 hangs. Each call notes what it did first."""
    import json, os, time

    LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl")

    def score(prompt, completion, row, metadata):
        sid = metadata["sample_id"]
        place = (metadata["group_id"] % 100000) * 4 + sid % 65536  # group in the step, sample in the group
        fate = {0: "raise", 1: "raise", 2: "hang"}.get(place % 20, "ok")
        with open(LOG, "a") as f:
            f.write(json.dumps({"step": metadata["step"], "sample_id": sid, "fate": fate}) + "\\n")
        if fate == "raise":
            raise RuntimeError(f"verifier crashed on sample {sid}")
        if fate == "hang":
            time.sleep(60)
        text = completion.strip()
        correct = float(metadata["finish_reason"] == "stop" and text == row["answer"])
        clean = float(text.isdigit())
        return {"score": correct + 0.1 * clean, "correct": correct, "clean": clean}
''')

SHORT = ["--set", "run.steps=3", "--set", "run.progress=false", "--set", "model.warmup_steps=10",
         "--set", "task.groups_per_step=10", "--set", "task.group_size=4", "--set", "trainer.microbatch_groups=2",
         "--set", "rollout.capacity=8", "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=1",
         "--set", "cluster.initial_preemptible=1"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    return env


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(900)  # a whole run; on a loaded 2-core machine it has taken 7 minutes
def test_a_run_survives_a_reward_function_that_raises_and_hangs(tmp_path):
    (tmp_path / "my_rewards.py").write_text(USER_MODULE)
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *SHORT,
                           "--set", "task.reward=my_rewards:score", "--set", "task.reward_timeout_s=2",
                           "--set", "task.reward_workers=2"],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    run = Path(proc.stdout.strip().splitlines()[-1])
    metrics = _jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]

    calls = _jsonl(tmp_path / "calls.jsonl")
    fates = Counter(c["fate"] for c in calls)
    assert (fates["raise"], fates["hang"], len(calls)) == (12, 6, 120)  # 10% raise, 5% hang
    total = 0
    for m in metrics:
        step_fates = Counter(c["fate"] for c in calls if c["step"] == m["step"])
        assert sum(step_fates.values()) == m["samples_trained"] == 40  # every sample scored once
        want = {k: n for k, n in (("RuntimeError", step_fates["raise"]), ("timeout", step_fates["hang"])) if n}
        assert m["reward_failures_by_kind"] == want
        assert m["reward_failures"] == step_fates["raise"] + step_fates["hang"]
        assert set(m["reward_parts"]) == {"correct", "clean"}
        assert all(0.0 <= v <= 1.0 for v in m["reward_parts"].values())
        total += m["reward_failures"]
    first = {k: v for m in metrics for k, v in m.get("reward_errors", {}).items()}
    assert "verifier crashed on sample" in first["RuntimeError"] and "reward_timeout_s=2" in first["timeout"]
    summary = (run / "summary.md").read_text()
    assert f"| reward failures (scored 0) | {total} (" in summary
    assert "RuntimeError" in summary and "timeout" in summary
