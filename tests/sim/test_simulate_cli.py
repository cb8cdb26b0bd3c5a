"""`rlboost simulate`: a scenario into a run directory like train's (config, metrics per step,
summary, plots with the saturation curve); an unknown scenario is bad input (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"), RLBOOST_CACHE=str(tmp_path / "cache"))
    env.pop("RLBOOST_SET", None)
    return env


def test_a_scenario_writes_its_run_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "simulate", "--scenario", "paper", "--steps", "3",
                           "--quiet"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Path(proc.stdout.strip().splitlines()[-1])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["tokens"] > 0 and m["preemptible_up"] == 4 for m in metrics)
    assert (run / "plots" / "saturation.png").stat().st_size > 0 and (run / "plots" / "steps.png").is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert [p["instances"] for p in summary["saturation"]] == [0, 1, 2, 3, 4, 6, 8]
    text = (run / "summary.md").read_text()
    assert "Saturation" in text and (run / "config.json").is_file()
    # the headline reaches the terminal; tokens are whole numbers, the lengths named as assumed
    assert "speedup" in proc.stderr and "reserved only" in proc.stderr and "4 instances" in proc.stderr
    assert isinstance(summary["tokens"], int) and f"| tokens | {summary['tokens']} |" in text
    assert "Response lengths are assumed" in text


def test_an_unknown_scenario_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "simulate", "--scenario", "mars"], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown scenario 'mars'" in proc.stderr
