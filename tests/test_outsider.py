"""With default settings, a process that does not hold the run's secret reads no tensor from a
live `rlboost train`: every port its processes listen on (the trainer's weight publisher, each
instance's relay and handoff servers, and whatever else) is dialled as a weight puller with
this process's own secret and with the empty one, and none hands over a byte of weights."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from own_processes import descendants, finish, jsonl, rlboost, wait_until

from rlboost.errors import AuthError, TransferError, VersionMismatch
from rlboost.transfer import TransferConfig, WeightPuller

RUN = ["--set", "run.steps=40", "--set", "run.progress=false", "--set", "model.warmup_steps=10",
       "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1"]


def _listening(pids: list[int]) -> set[int]:
    """TCP ports the processes listen on (Linux: their socket inodes against /proc/net/tcp)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # the process ended meanwhile
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux /proc")
def test_a_process_without_the_runs_secret_reads_no_tensor_from_a_live_run(tmp_path, monkeypatch):
    monkeypatch.delenv("RLBOOST_SECRET", raising=False)
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    for name in ("RLBOOST_RAY_ADDRESS", "RLBOOST_SET", "RLBOOST_SECRET"):
        env.pop(name, None)
    proc = rlboost(RUN, tmp_path, env)
    try:
        run = wait_until(lambda: next((tmp_path / "runs").glob("*/events.jsonl"), None), 240, "run directory",
                         proc).parent
        # the publisher holds a version and the instance has pulled it: every server is up
        wait_until(lambda: any(e["kind"] == "active" and e["pool"] == "preemptible"
                               for e in jsonl(run / "events.jsonl")), 240, "an active instance", proc)
        ports = _listening([proc.pid, *descendants(proc.pid)])
        rank0 = [e for e in jsonl(run / "events.jsonl") if e["kind"] == "processes"][-1]["trainer_ranks"][0]["pid"]
        publisher_side = _listening([rank0])
        refused, refused_ports = 0, set()
        for port in sorted(ports):
            for config in (TransferConfig(transport="tcp", relay=False, connect_timeout_s=2.0, request_timeout_s=2.0),
                           TransferConfig(transport="tcp", relay=False, secret=b"", allow_no_secret=True,
                                          connect_timeout_s=2.0, request_timeout_s=2.0)):
                try:
                    with WeightPuller(f"127.0.0.1:{port}", config) as outsider:
                        got = outsider.pull(1)
                except VersionMismatch:
                    pytest.fail(f"port {port} let a puller without the run's secret log in")
                except AuthError:
                    refused += 1
                    refused_ports.add(port)  # an rlboost server: the login failed before anything was sent
                    continue
                except (TransferError, OSError):
                    continue  # not an rlboost server (Ray, gloo): it speaks no weight protocol
                pytest.fail(f"port {port} handed over weights without the run's secret: {list(got)[:3]}")
        # the trainer's publisher, the instance's relay and handoff servers (at least) refused
        assert refused >= 2 * 2, (refused, sorted(ports))
        assert refused_ports & publisher_side, "the trainer's publisher was not among the ports dialled"
    finally:  # Ctrl-C: the run stops after its step (whatever the dialled ports made of it)
        proc.send_signal(signal.SIGINT)
        finish(proc, 300)
