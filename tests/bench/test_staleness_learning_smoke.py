"""bench/staleness_learning.py reads runs' metrics.jsonl and ends with its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "staleness_learning.py"


def fake_run(root: Path, name: str, rewards, staleness: int) -> None:
    d = root / f"{name}-embedded-20260101-000000"
    d.mkdir(parents=True)
    rows = [{"step": i + 1, "reward_mean": r, "samples_trained": 8, "elapsed_s": 10.0 * (i + 1),
             **({"staleness_tokens": [90, 10], "is_weight_mean": 1.02, "is_truncated_share": 0.01}
                if staleness else {})} for i, r in enumerate(rewards)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_final_rewards_per_staleness_a_plot_and_the_json_line(tmp_path):
    for seed in (0, 1):
        fake_run(tmp_path / "runs", f"tiny_s0_seed{seed}", [0.2, 0.4, 0.6], 0)
        fake_run(tmp_path / "runs", f"tiny_s1_seed{seed}", [0.2, 0.4, 0.5], 1)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path / "runs"), "--last", "2",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["value"] == -0.05 and result["peers"]["staleness_1"]["is_truncated_share"] == 0.01
    assert result["peers"]["staleness_1"]["stale_token_share"] == 0.1
    assert (tmp_path / "out" / "staleness_learning_tiny_cpu2.png").is_file()
