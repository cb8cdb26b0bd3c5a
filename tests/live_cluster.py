"""A multi-node Ray cluster on this machine (Ray's own ray.cluster_utils.Cluster: a head with
the `reserved` resource, preemptible nodes added and removed at will, from this process's
main thread as Ray requires), `rlboost train` of the tiny model joined to it with live
capacity, `rlboost notice`, Ray's fake multi-node autoscaler on a head of this test's
own, and a reader of the run's events: used by the tests of live capacity and by
bench/live_capacity.py.

Everything stays on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported),
and every metadata URL of the run points at a loopback address: nothing here ever reaches
a real cloud's metadata service.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402
from ray._raylet import AuthenticationTokenLoader  # noqa: E402
from ray._raylet import Config as RayConfig  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.experimental.internal_kv import _internal_kv_get  # noqa: E402

from rlboost.cluster.notices.base import SOURCE_LABEL  # noqa: E402

HEAD_CPUS = 2
OBJECT_STORE = 80 << 20


def closed_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (a probe there is refused at once)."""
    return f"http://127.0.0.1:{_free_port()}"


class LocalCluster:
    """A head (reserved units for the run's trainer ranks and reserved engines) and
    preemptible nodes, each labelled with the notice source its agent should use."""

    def __init__(self, reserved: int = 3):
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=HEAD_CPUS, resources={"reserved": reserved}, object_store_memory=OBJECT_STORE,
            include_dashboard=False))
        self.nodes: dict[str, Any] = {}  # node id -> ray's Node
        self.token = ""

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, source: str = "none", preemptible: int = 1, cpus: int = 1) -> str:
        """A preemptible node joins; returns its node id once it is up."""
        node = self.cluster.add_node(num_cpus=cpus, resources={"preemptible": preemptible},
                                     labels={SOURCE_LABEL: source}, object_store_memory=OBJECT_STORE)
        self.cluster.wait_for_nodes()
        self.nodes[node.node_id] = node
        return node.node_id

    def remove(self, node_id: str) -> None:
        """The node leaves (its raylet and every process of it end now)."""
        self.cluster.remove_node(self.nodes.pop(node_id))

    def close(self) -> None:
        self.cluster.shutdown()


@contextlib.contextmanager
def connected(address: str, token: str) -> Iterator[None]:
    """This process speaks Ray's token authentication with `token` (what it starts inherits
    it) and is connected to the cluster at address, while inside."""
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    _reread_auth()
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reread_auth()


def _reread_auth() -> None:
    """Ray keeps the mode in its config and the token in a loader's cache: both read again."""
    RayConfig.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def local_cluster(workdir: Path, reserved: int = 3) -> Iterator[LocalCluster]:
    """The cluster, with Ray's token authentication (a token of its own), and this process
    connected to it (to read what the run asked of the autoscaler). A run joins it as
    `rlboost train` does: run_env() gives the token, and rlboost turns token mode on."""
    token = secrets.token_hex(16)
    workdir.mkdir(parents=True, exist_ok=True)
    previous = os.getcwd()
    os.chdir(workdir)
    cluster = None
    try:
        with connected("", token):
            cluster = LocalCluster(reserved)
            cluster.token = token
            ray.init(address=cluster.address, log_to_driver=False)
            yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        os.chdir(previous)


def socket_folder(hook_dir: Path) -> Path:
    """hook_dir, or, when its sockets' paths would be longer than a Unix socket allows (a
    long TMPDIR), a short folder under /tmp named after it."""
    if len(os.fsencode(str(hook_dir))) + 21 <= 107:  # "/" + 16 hex digits + ".sock"
        return hook_dir
    return Path("/tmp") / f"rlb-{hashlib.sha256(os.fsencode(str(hook_dir))).hexdigest()[:12]}"


def live_overrides(hook_dir: Path, steps: int, **more: Any) -> list[str]:
    """--set assignments of a short live run of the tiny model with emulated engines (each
    sample decodes a few seconds, so a node's instance is busy when it goes)."""
    loopback = {f"cluster.notices.{name}_url": closed_url() for name in ("aws", "gcp", "azure")}
    settings = {
        "cluster.capacity": "live", "transfer.bind_host": "0.0.0.0", "trainer.rendezvous": "tcp",
        "run.steps": steps, "run.progress": "false", "run.checkpoint_every": 1000, "model.warmup_steps": 10,
        "task.groups_per_step": 8, "task.group_size": 4, "trainer.microbatch_groups": 2,
        "rollout.capacity": 16, "trainer.world_size": 1, "cluster.max_preemptible": 3, "cluster.live_poll_s": 0.25,
        "cluster.notices.poll_s": 0.25, "cluster.notices.hook_dir": str(socket_folder(hook_dir)),
        "rollout.backend": "emulated", "task.max_new_tokens": 24, "rollout.emulated.decode_tokens_per_s": 200,
        "rollout.emulated.sample_tokens_per_s": 8, "rollout.emulated.stop_probability": 0.01,
        **loopback, **more}
    return [f"{k}={v}" for k, v in settings.items()]


class Events:
    """The run's events.jsonl, read as it grows."""

    def __init__(self, runs: Path):
        self.runs = runs
        self._seen: list[dict] = []  # what the running wait() read last, for matchers that look around

    def all(self) -> list[dict]:
        found = sorted(self.runs.glob("*/events.jsonl"))
        if not found:
            return []
        return [json.loads(line) for line in found[-1].read_text().splitlines() if line.strip()]

    def metrics(self) -> list[dict]:
        found = sorted(self.runs.glob("*/metrics.jsonl"))
        return [json.loads(line) for line in found[-1].read_text().splitlines() if line.strip()] if found else []

    def wait(self, match: Callable[[dict], bool], timeout_s: float, what: str) -> dict:
        """The first event that matches (the file read every 50 ms); TimeoutError naming what
        after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._seen = self.all()
            hit = next((e for e in self._seen if match(e)), None)
            if hit is not None:
                return hit
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout_s:g} s")
            time.sleep(0.05)

    def on_node(self, node_id: str, kind: str) -> Callable[[dict], bool]:
        """Matches an instance event of the instance the run placed on node_id (its join among
        the events wait() read: once per read, not once per event)."""
        def match(e: dict) -> bool:
            if e.get("kind") != kind:
                return False
            return e.get("instance") in {x["instance"] for x in self._seen
                                         if x.get("kind") == "join" and x.get("node") == node_id}
        return match

    def steps_done(self) -> int:
        return len(self.metrics())


def run_env(cluster: LocalCluster, runs: Path) -> dict[str, str]:
    """The environment of `rlboost train` joining the cluster: its token (RAY_AUTH_MODE is left
    unset, so rlboost's own default turns token authentication on), run directories under runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RLBOOST_RAY_ADDRESS", "RLBOOST_SET")}
    return {**env, "RAY_AUTH_TOKEN": cluster.token, "RLBOOST_RUN_ROOT": str(runs),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def start_run(cluster: LocalCluster, runs: Path, overrides: list[str], cwd: Path) -> subprocess.Popen:
    """`rlboost train` joined to the cluster with live capacity, as a user starts it."""
    args = [a for o in [f"cluster.address={cluster.address}", *overrides] for a in ("--set", o)]
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "rlboost.cli", "train", *args], cwd=cwd,
                            env=run_env(cluster, runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def autoscaler_request() -> list:
    """The cluster's standing request_resources() bundles, as Ray's autoscaler reads them."""
    raw = _internal_kv_get(b"autoscaler_resource_request")
    return json.loads(raw) if raw else []


def stop_run(proc: subprocess.Popen, timeout_s: float = 300.0, interrupted: bool = False) -> tuple[int, str, str]:
    """Ctrl-C (the step ends, a checkpoint, exit; unless already sent), then wait for the run to end."""
    if not interrupted:
        proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def notice(hook_dir: Path, grace_s: float, node: str | None = None, wait: bool = False) -> subprocess.CompletedProcess:
    """`rlboost notice --grace S` as a node's shutdown hook runs it."""
    args = ["--grace", str(grace_s), "--dir", str(socket_folder(hook_dir)), *(["--node", node] if node else []),
            *(["--wait"] if wait else [])]
    return subprocess.run([sys.executable, "-m", "rlboost.cli", "notice", *args], capture_output=True, text=True,
                          timeout=grace_s + 60)


class FakeAutoscalingHead:
    """Ray's fake multi-node autoscaler (the fake_multinode provider, which ray.cluster_utils'
    AutoscalingCluster drives) on a head of this harness's own: `ray start --head --block` on a
    free port, in a temporary folder of its own, with the config built here (the wheel lacks
    the provider's example.yaml). AutoscalingCluster itself runs `ray stop --force`, which would
    stop every Ray cluster on the machine; this one stops only the processes it started (the
    head's process tree, the autoscaler's worker nodes included). Spot nodes: `preemptible` 1,
    one CPU each, at most max_workers; idle ones go after idle_minutes."""

    def __init__(self, folder: Path, reserved: int = 3, max_workers: int = 2, idle_minutes: float = 0.1):
        self.folder, self.reserved, self.token = folder, reserved, secrets.token_hex(16)
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.config = {
            "cluster_name": "rlboost-fake", "max_workers": max_workers, "idle_timeout_minutes": idle_minutes,
            "upscaling_speed": 1.0, "head_node_type": "ray.head.default", "auth": {"ssh_user": "ubuntu"},
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": self.address},
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": HEAD_CPUS, "reserved": reserved}, "node_config": {},
                                     "max_workers": 0},
                "spot": {"resources": {"CPU": 1, "preemptible": 1, "object_store_memory": OBJECT_STORE},
                         "labels": {SOURCE_LABEL: "none"}, "node_config": {}, "min_workers": 0,
                         "max_workers": max_workers}},
            **{k: [] for k in ("initialization_commands", "setup_commands", "head_setup_commands",
                               "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
                               "cluster_synced_files", "rsync_exclude", "rsync_filter")},
            "file_mounts": {}, "file_mounts_sync_continuously": False}
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def start(self, timeout_s: float = 180.0) -> FakeAutoscalingHead:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "autoscaler.json"
        config.write_text(json.dumps(self.config))
        log = self.folder / "head.log"
        self.proc = subprocess.Popen(
            ["ray", "start", "--head", "--block", f"--port={self.port}", f"--num-cpus={HEAD_CPUS}",
             f"--resources={json.dumps({'reserved': self.reserved})}", f"--autoscaling-config={config}",
             f"--object-store-memory={OBJECT_STORE}",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self.folder / 'ray'}",
             f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={_free_port()}"],
            env=self.env(), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the autoscaling head did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        """SIGTERM the head's `ray start` (it stops its own processes), then kill whatever of its
        tree is left: the autoscaler's fake worker nodes do not stop with it."""
        from own_processes import descendants, kill_leftovers, started_at

        if self.proc is None:
            return
        left = {pid: started_at(pid) for pid in [self.proc.pid, *descendants(self.proc.pid)]}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        kill_leftovers(left)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spot_nodes() -> list[str]:
    """Ids of the alive nodes with the `preemptible` resource (this process connected)."""
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("preemptible", 0) > 0]


def until(probe: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """probe() once it is truthy (polled every 50 ms); TimeoutError naming what after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:g} s")
        time.sleep(0.05)
    return found


def autoscaler_round(head: FakeAutoscalingHead, runs: Path, overrides: list[str], cwd: Path, count: int) -> dict:
    """A live run on the autoscaling head, which starts with no spot node: how long the
    autoscaler takes to launch `count` spot nodes once the run asks (up_s), until the run
    serves on each, and to take them back once Ctrl-C has made the run withdraw (down_s).
    This process must be connected to the head (connected())."""
    proc = start_run(head, runs, overrides, cwd)
    events = Events(runs)
    try:
        until(lambda: autoscaler_request() == [{"preemptible": 1.0}] * count, 400, "the run's request")
        asked = time.monotonic()
        nodes = until(lambda: len(n := spot_nodes()) == count and n, 180, f"{count} spot nodes from the autoscaler")
        up_s = time.monotonic() - asked
        for node in nodes:
            events.wait(events.on_node(node, "first_sample"), 180, f"a sample on node {node[:8]}")
        served_s = time.monotonic() - asked
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the step ends, then the run closes
    until(lambda: autoscaler_request() == [], 300, "the request withdrawn")
    withdrawn = time.monotonic()
    until(lambda: spot_nodes() == [], 300, "the spot nodes scaled down")
    down_s = time.monotonic() - withdrawn
    code, _, err = stop_run(proc, interrupted=True)
    return {"up_s": up_s, "served_s": served_s, "down_s": down_s, "code": code, "err": err, "nodes": nodes}
