"""bench/paper_figures.py runs end to end on small shapes: the checks asked for, each published
figure beside the reference mode's prediction and rlboost's, the results file and the JSON line."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "paper_figures.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RLBOOST_RUN_ROOT=str(tmp_path / "runs"))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def test_figures_beside_their_predictions_on_small_shapes(tmp_path):
    out = tmp_path / "figures.md"
    proc = _run(tmp_path, "--figures", "verl,11,14", "--steps", "3", "--trace-steps", "3", "--skip", "1",
                "--set", "task.groups_per_step=8", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["metric"] == "reference_predictions_within_15_percent" and result["unit"] == "checks"
    peers = result["peers"]
    assert set(peers) == {"verl_8b_tokens_per_s", "fig11_1_throughput", "fig11_1_tokens_per_usd",
                          "fig11_6_throughput", "fig11_6_tokens_per_usd", "fig14_100s", "fig14_200s"}
    assert peers["verl_8b_tokens_per_s"]["published"] == 10_400.0
    assert abs(peers["fig11_6_throughput"]["published"] - 1.37 * 1.64) < 1e-3  # the text's +37%, then +64%
    for name in ("fig11_1_throughput", "fig11_6_throughput", "fig11_6_tokens_per_usd"):
        assert peers[name]["reference"] > 0 and peers[name]["rlboost"] > 0
    # migrating what a lost instance made never costs more than recomputing it from the prompt (a
    # preemption after the rollout is over has no overhead to cut, and no figure)
    assert all(0.0 <= r[m] <= 1.0 for r in (peers["fig14_100s"], peers["fig14_200s"]) for m in r if m != "published")
    defined = sum(1 for r in peers.values() if "reference" in r)
    assert 0 <= result["value"] <= result["ceiling"] == defined
    text = out.read_text()
    assert "Fig. 11: 14B, 6 instances" in text and "Command: `python bench/paper_figures.py --figures" in text


def test_unknown_figure_is_refused_before_any_run(tmp_path):
    proc = _run(tmp_path, "--figures", "10,99")
    assert proc.returncode != 0 and "--figures must name some of" in proc.stderr
