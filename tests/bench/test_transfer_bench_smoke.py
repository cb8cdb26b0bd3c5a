"""The transfer bandwidth bench runs end to end in its quick mode and ends with its JSON line."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "transfer_bandwidth.py"


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_quick_run_prints_table_then_one_json_line():
    proc = _run("--quick")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert "Transfer bandwidth" in proc.stdout
    assert any("raw socket" in line for line in lines[:-1])
    result = json.loads(lines[-1])
    assert set(result) == {"metric", "value", "unit", "ceiling", "peers"}
    assert result["metric"] == "tcp_pull_GBps" and result["unit"] == "GB/s"
    assert result["ceiling"] > 0
    peers = result["peers"]
    for key in ("memcpy_numpy_GBps", "socket_GBps", "gloo_GBps"):
        assert peers[key]["64MiB"] > 0, key
    assert "ratios" in peers and "missing" in peers
    # Ray and UCX either measured or named as missing with a reason, never silently absent.
    assert "ray_GBps" in peers or "ray" in peers["missing"]
    assert "ucxx_tcp_GBps" in peers or "ucxx" in peers["missing"]


def test_unknown_peer_is_a_usage_error():
    proc = _run("--peers", "memcpy,carrier-pigeon", timeout=60)
    assert proc.returncode == 2
    assert "carrier-pigeon" in proc.stderr
