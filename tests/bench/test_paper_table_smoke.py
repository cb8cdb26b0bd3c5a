"""The paper table bench runs end to end in a short simulated mode: every row, the breakdown of
a 4-instance step, the workload sensitivity, its results file and its JSON line."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "paper_table.py"
ROWS = ("reserved only", "rlboost, 1 instance", "rlboost, 2 instances", "rlboost, 3 instances",
        "rlboost, 4 instances", "rlboost, spot trace", "reference, spot trace")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RLBOOST_RUN_ROOT=str(tmp_path / "runs"))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_simulated_table_with_breakdown_sensitivity_and_json_line(tmp_path):
    out = tmp_path / "paper.md"
    # steps 3..5 counted: rlboost's window policy makes its first adjustment in step 2; the
    # staleness rows at 4 instances only (at 1-3 instances they run the same path)
    proc = _run(tmp_path, "--fidelity", "simulated", "--steps", "5", "--skip", "2", "--seeds", "2",
                "--trace-steps", "4", "--staleness-counts", "4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["metric"] == "tokens_per_dollar_gain_4_instances" and result["unit"] == "x"
    peers = result["peers"]
    assert set(ROWS) <= set(peers)
    sim = {row: peers[row]["simulated"] for row in ROWS}
    # throughput rises as instances are added, and the 4-instance row is the JSON line's figure
    rates = [sim[row]["tokens_per_s"] for row in ROWS[:5]]
    assert rates == sorted(rates) and rates[0] < rates[-1]
    assert abs(result["speedup"] - rates[-1] / rates[0]) < 1e-3
    four = sim["rlboost, 4 instances"]
    assert 0 < four["window_s"] < four["rollout_end_s"] <= four["step_s"]
    assert set(peers["trace_rlboost_over_reference"]) == {"mean", "sd", "seeds"}
    for schedule in ("rlboost", "after rollout"):  # both schedules of the steps ahead, both bounds
        for bound in (1, 2):
            assert 0 < peers[f"{schedule}, staleness {bound}, 4 inst."]["simulated"]["stale_share"] <= 1
    assert len(peers["sensitivity_4_instances"]) == 4
    # the artifact's measured curve is printed beside the reference mode's prediction, first
    assert set(peers["artifact_curve"]) == {"0", "1", "2", "3", "4"}
    assert proc.stdout.index("the artifact's measured curve") < proc.stdout.index("reserved only  ")
    assert all(x > 1.0 for x in peers["sensitivity_4_instances"].values())
    text = out.read_text()
    assert "a step at 4 instances (simulated, mean)" in text and "responses capped at 8,192 tokens" in text
    assert "Command: `python bench/paper_table.py --fidelity simulated" in text


def test_bad_skip_is_refused_before_any_run(tmp_path):
    proc = _run(tmp_path, "--fidelity", "simulated", "--steps", "3", "--skip", "3")
    assert proc.returncode != 0
    assert "--skip must be in [1, --steps)" in proc.stderr
