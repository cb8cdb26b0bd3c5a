"""bench/gpu_check.sh is the one command a GPU machine runs; on a machine without a CUDA device
(here forced by hiding every device) it must say it skipped and succeed, not fail a CI job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_skips_cleanly_without_a_cuda_device(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable, RLBOOST_GPU_CHECK_OUT=str(tmp_path))
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "gpu_check: skipped: no CUDA device"
    assert not (tmp_path / "build.log").exists()  # nothing was built
