"""Whole `rlboost train` runs for the tests that drive a real engine end to end: the command
in a subprocess with its own run root, and the run directory's JSON-lines files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def train(tmp_path: Path, args: list[str], timeout_s: float = 1700) -> Path:
    """Runs `rlboost train ARGS` (the installed package: cwd is tmp_path, not the source
    tree), asserts it succeeded, and returns its run directory."""
    env = {**os.environ, "RLBOOST_RUN_ROOT": str(tmp_path / "runs"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RLBOOST_RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
