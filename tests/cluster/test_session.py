"""A Ray cluster a run joins must offer the run's custom resources, or the run stops at
once with what to start the nodes with (rather than actors pending until a timeout)."""

from __future__ import annotations

import pytest

from rlboost.cluster.session import RaySettings, check_resources
from rlboost.errors import ConfigError


@pytest.mark.parametrize("have", [{"CPU": 8.0}, {"reserved": 4.0}, {"reserved": 2.0, "preemptible": 3.0}])
def test_a_cluster_without_the_run_resources_is_refused_with_the_fix(have):
    with pytest.raises(ConfigError, match=r"reserved >= 3 .*ray start --resources"):
        check_resources(have, RaySettings(reserved=3, preemptible=2))


def test_a_cluster_with_them_is_accepted():
    check_resources({"CPU": 8.0, "reserved": 3.0, "preemptible": 1.0}, RaySettings(reserved=3, preemptible=5))


def test_a_local_run_starts_its_own_cluster_beside_another_one(tmp_path):
    """Another Ray cluster on the machine (`ray start --head`, as many Ray users keep one):
    a run without cluster.address starts a cluster of its own beside it (a bare ray.init()
    would join that one and fail on the run's resources), and leaves the other untouched.
    The other cluster is stopped by killing only the processes its `ray start` started."""
    import json
    import os
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile
    import time

    from own_processes import descendants, kill_leftovers, started_at

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "RLBOOST_RUN_ROOT": str(tmp_path / "runs")}
    env.pop("RLBOOST_RAY_ADDRESS", None)
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "other.log"
    short = tempfile.mkdtemp(prefix="rlb-", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    head = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={short}", "--object-store-memory=80000000"],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    other: dict[int, int | None] = {}
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        other = {pid: started_at(pid) for pid in [head.pid, *descendants(head.pid)]}
        steps = ["--set", "run.steps=1", "--set", "run.progress=false", "--set", "model.warmup_steps=10",
                 "--set", "task.groups_per_step=4", "--set", "task.group_size=2", "--set", "cluster.trace=none",
                 "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1"]
        run = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *steps], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert all(started_at(pid) == start for pid, start in other.items())  # the other cluster lives on
        probe = ("import json, ray; ray.init(address='127.0.0.1:%d', log_to_driver=False); "
                 "print(json.dumps([len([n for n in ray.nodes() if n['Alive']]), ray.cluster_resources()]))" % port)
        seen = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert seen.returncode == 0, seen.stderr[-2000:]
        nodes, resources = json.loads(seen.stdout.strip().splitlines()[-1])
        assert nodes == 1 and "reserved" not in resources  # the run never joined it
    finally:
        if head.poll() is None:
            head.terminate()  # `ray start --block` stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        kill_leftovers(other)
        shutil.rmtree(short, ignore_errors=True)
