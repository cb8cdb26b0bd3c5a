"""The transfer bandwidth bench runs end to end in its quick mode and ends with its JSON line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "transfer_bandwidth.py"
REQUIRED_KEYS = {"metric", "value", "unit", "ceiling", "peers"}


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _final_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Transfer bandwidth" in proc.stdout  # the table comes before the JSON line
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == REQUIRED_KEYS
    assert result["metric"] == "tcp_pull_GBps" and result["unit"] == "GB/s"
    assert result["ceiling"] > 0
    return result


def test_quick_pull_against_its_ceiling_and_socket_peer():
    result = _final_json(_run("--quick", "--peers", "memcpy,socket,reftcp,pull", "--ref-streams", "2"))
    peers = result["peers"]
    assert result["value"] == peers["tcp_pull_GBps"]["64MiB"] > 0
    assert peers["socket_GBps"]["64MiB"] > 0
    assert peers["ref_tcp_GBps"]["64MiB"] > 0  # the reference's push engine, same bytes checked
    assert "64MiB" in peers["ratios"]["tcp_pull/ref_tcp"]
    assert "64MiB" in peers["ratios"]["tcp_pull/socket"]
    assert peers["tcp_pull_cpu_s_per_GB"]["64MiB"] > 0  # CPU cost of both ends
    assert "shm_pull_GBps" in peers or "rlboost pull (shm)" in peers["missing"]


@pytest.mark.slow
def test_quick_run_covers_every_peer_and_provisioning():
    result = _final_json(_run("--quick"))
    peers = result["peers"]
    for key in ("memcpy_numpy_GBps", "socket_GBps", "gloo_GBps", "tcp_pull_GBps"):
        assert peers[key]["64MiB"] > 0, key
    # Ray and UCX are either measured or named as missing with a reason, never silently absent.
    assert {"ray_same_host_GBps", "ray_cross_node_GBps"} <= set(peers) or "ray" in peers["missing"]
    assert "ucxx_tcp_GBps" in peers or "ucxx" in peers["missing"]
    for count in ("1", "2"):
        assert set(peers["provision_s"][count]) == {"relay", "no_relay"}
    for key in ("tcp_kept", "tcp_new", "socket"):  # small-payload time per transfer
        assert peers["latency_ms"][key]["median"] > 0, key
    assert "provision2_relay/no_relay" in peers["ratios"]


@pytest.mark.parametrize("args, named", [
    (("--peers", "memcpy,carrier-pigeon"), "carrier-pigeon"),
    (("--pull-config", "streams"), "KEY=INTEGER"),
    (("--ref-streams", "0"), "--ref-streams"),
])
def test_bad_arguments_are_usage_errors(args, named):
    proc = _run(*args, timeout=60)
    assert proc.returncode == 2
    assert named in proc.stderr
