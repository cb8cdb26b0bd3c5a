"""`rlboost train` on a math data set of which 10% is hostile: reference answers of 5,000
digits (past Python's integer-string limit), records nested 100,000 deep, invalid UTF-8 and
10 MB lines. The run trains to its end; the records it could not read are refused at load
and counted by cause, and the samples of the problems whose answers cannot be compared score
0, counted by kind, in metrics.jsonl and in the summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GOOD = 72
HOSTILE = {"huge number": 2, "too deep": 2, "not UTF-8": 2, "too long": 2}  # 8 of 80: 10%
STEPS, GROUP_SIZE = 3, 4
GROUPS = 25  # a third of the problems read, each step


def _records() -> list[bytes]:
    good = [json.dumps({"question": f"{a}+{b}=", "answer": f"#### {a + b}"}).encode()
            for a in range(9) for b in range(8)]
    hostile = [json.dumps({"question": "7+7=", "answer": "#### " + "7" * 5000}).encode(),
               b"[" * 100_000 + b"]" * 100_000,
               b'{"question": "1+\xff=", "answer": "#### 1"}',
               json.dumps({"question": "x" * (10 << 20), "answer": "#### 2"}).encode()]
    records = list(good)
    for i, line in enumerate(hostile * 2):  # spread through the file
        records.insert(9 * i + 4, line)
    return records


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("hostile")
    (base / "mixed.jsonl").write_bytes(b"\n".join(_records()) + b"\n")
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(base / "runs"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    settings = {"run.steps": STEPS, "run.progress": "false", "task.name": "math", "task.math.path": "mixed.jsonl",
                "task.groups_per_step": GROUPS, "task.group_size": GROUP_SIZE, "trainer.microbatch_groups": 5,
                "rollout.capacity": 16, "cluster.trace": "none", "cluster.max_preemptible": 1,
                "cluster.initial_preemptible": 1, "trainer.world_size": 1}
    args = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.run([sys.executable, "-m", "rlboost", "train", *args], cwd=base, env=env,
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert len(proc.stdout.strip().splitlines()) == 1  # stdout: the run directory, nothing else
    return Path(proc.stdout.strip())


@pytest.mark.timeout(900)  # a whole run; on a loaded 2-core machine one has taken minutes
def test_a_data_set_with_hostile_records_trains_to_the_end_and_counts_what_it_refused(hostile_run):
    metrics = [json.loads(line) for line in (hostile_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    refused = {k: v for k, v in HOSTILE.items() if k != "huge number"}
    assert metrics[-1]["records_refused"] == refused
    # the samples of a huge-answer problem that stopped score 0 as AnswerTooLong, and the run goes on
    failures = sum(m["reward_failures_by_kind"].get("AnswerTooLong", 0) for m in metrics)
    assert failures > 0 and set().union(*(m["reward_failures_by_kind"] for m in metrics)) == {"AnswerTooLong"}
    summary = (hostile_run / "summary.md").read_text()
    assert "| data set records refused at load | 6 (" in summary
    assert all(f"2 {cause}" in summary for cause in refused)
    assert f"{failures} AnswerTooLong" in summary
    for m in metrics:  # the per-step figures a verl or TRL user looks for
        assert m["lr"] > 0 and m["response_length_mean"] > 0 and m["entropy"] >= 0
