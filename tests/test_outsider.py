"""A live `rlboost train` with default settings, started while another Ray cluster runs on
the machine (`ray start --head`, as many Ray users keep one), is watched for two things:

- a process that does not hold the run's secret reads no tensor from it: every port its
  processes listen on (the trainer's weight publisher, each instance's relay and handoff
  servers, and whatever else) is dialled as a weight puller with this process's own secret
  and with the empty one, and none hands over a byte of weights;
- the run starts a cluster of its own beside the other one (a bare ray.init() would join
  that one and fail on the run's resources) and leaves the other untouched.

One run serves both (each run spends most of its time starting Ray and its processes): the
fixture records what it saw and the tests below judge it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from own_processes import descendants, finish, jsonl, kill_leftovers, rlboost, started_at, wait_until

from rlboost.errors import AuthError, TransferError, VersionMismatch
from rlboost.transfer import TransferConfig, WeightPuller

RUN = ["--set", "run.steps=40", "--set", "run.progress=false", "--set", "model.warmup_steps=10",
       "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1",
       "--set", "trainer.world_size=1"]  # one trainer rank: nothing here depends on the rank count (two ranks: test_train_cli, test_supervision)


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


def _dial_every_port(ports: set[int]) -> tuple[list[str], int, set[int]]:
    """Dial each port as a weight puller with this process's secret and with the empty one:
    (what went wrong, logins refused, ports that refused one)."""
    wrong, refused, refused_ports = [], 0, set()
    for port in sorted(ports):
        for config in (TransferConfig(transport="tcp", relay=False, connect_timeout_s=2.0, request_timeout_s=2.0),
                       TransferConfig(transport="tcp", relay=False, secret=b"", allow_no_secret=True,
                                      connect_timeout_s=2.0, request_timeout_s=2.0)):
            try:
                with WeightPuller(f"127.0.0.1:{port}", config) as outsider:
                    got = outsider.pull(1)
            except VersionMismatch:
                wrong.append(f"port {port} let a puller without the run's secret log in")
                continue
            except AuthError:
                refused += 1
                refused_ports.add(port)  # an rlboost server: the login failed before anything was sent
                continue
            except (TransferError, OSError):
                continue  # not an rlboost server (Ray, gloo): it speaks no weight protocol
            wrong.append(f"port {port} handed over weights without the run's secret: {list(got)[:3]}")
    return wrong, refused, refused_ports


def _other_cluster(port: int, temp_dir: str, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`ray start --head --block` on 127.0.0.1:port, once it says it runs."""
    with log.open("w") as out:  # the node writes to it; this process needs no handle of its own
        head = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block", f"--port={port}",
             "--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats",
             f"--temp-dir={temp_dir}", "--object-store-memory=80000000"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text():
        assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return head


@pytest.fixture(scope="module")
def beside(tmp_path_factory) -> dict:
    """Another Ray cluster, then a live run beside it dialled by an outsider and the other
    cluster probed while the run is up; the run stopped by Ctrl-C, the other one by killing
    only the processes its `ray start` started. What was seen, as a dict."""
    tmp_path = tmp_path_factory.mktemp("beside")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_AUTH_MODE="disabled")
    for name in ("RLBOOST_RAY_ADDRESS", "RLBOOST_SET", "RLBOOST_SECRET", "RAY_ADDRESS"):
        env.pop(name, None)
    short = tempfile.mkdtemp(prefix="rlb-", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    head, other, seen = None, {}, {}
    try:
        head = _other_cluster(port, short, tmp_path / "other.log", env)
        other = {pid: started_at(pid) for pid in [head.pid, *descendants(head.pid)]}
        proc = rlboost(RUN, tmp_path, env)
        try:
            run = wait_until(lambda: next((tmp_path / "runs").glob("*/events.jsonl"), None), 240,
                             "run directory", proc).parent
            # the publisher holds a version and the instance has pulled it: every server is up
            wait_until(lambda: any(e["kind"] == "active" and e["pool"] == "preemptible"
                                   for e in jsonl(run / "events.jsonl")), 240, "an active instance", proc)
            ports = _listening([proc.pid, *descendants(proc.pid)])
            rank0 = [e for e in jsonl(run / "events.jsonl") if e["kind"] == "processes"][-1]["trainer_ranks"][0]["pid"]
            seen["publisher_ports"] = _listening([rank0])
            seen["ports"] = ports
            seen["wrong"], seen["refused"], seen["refused_ports"] = _dial_every_port(ports)
            probe = ("import json, ray; ray.init(address='127.0.0.1:%d', log_to_driver=False); "
                     "print(json.dumps([len([n for n in ray.nodes() if n['Alive']]), ray.cluster_resources()]))" % port)
            looked = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                                    text=True, timeout=120)
            assert looked.returncode == 0, looked.stderr[-2000:]
            seen["other_nodes"], seen["other_resources"] = json.loads(looked.stdout.strip().splitlines()[-1])
        finally:  # Ctrl-C: the run stops after its step (whatever the dialled ports made of it)
            proc.send_signal(signal.SIGINT)
            seen["code"], _, seen["err"] = finish(proc, 300)
        seen["other_lives"] = all(started_at(pid) == start for pid, start in other.items())
    finally:
        if head is not None and head.poll() is None:
            head.terminate()  # `ray start --block` stops what it started
        try:
            if head is not None:
                head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        kill_leftovers(other)
        shutil.rmtree(short, ignore_errors=True)
    return seen


@pytest.mark.timeout(900)  # the module's whole run; on a loaded 2-core machine one has taken minutes
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux /proc")
def test_a_process_without_the_runs_secret_reads_no_tensor_from_a_live_run(beside):
    assert not beside["wrong"], beside["wrong"]
    # the trainer's publisher, the instance's relay and handoff servers (at least) refused
    assert beside["refused"] >= 2 * 2, (beside["refused"], sorted(beside["ports"]))
    assert beside["refused_ports"] & beside["publisher_ports"], "the trainer's publisher was not among the ports dialled"


@pytest.mark.timeout(900)  # the module's whole run; on a loaded 2-core machine one has taken minutes
def test_a_local_run_starts_its_own_cluster_beside_another_one(beside):
    # the run worked beside the other cluster and stopped as a Ctrl-C stops it
    assert beside["code"] == 130, beside["err"][-3000:]
    assert beside["other_lives"]  # the other cluster's processes are the ones it started, all alive
    # the run never joined it: one node, none of the run's resources (seen while the run was up)
    assert beside["other_nodes"] == 1 and "reserved" not in beside["other_resources"]
