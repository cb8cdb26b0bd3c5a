"""A preemption is also a whole node's death, as on a cloud. Two Ray nodes on this machine,
started as README's "Several machines" says: a head with the `reserved` resource, and a
preemptible node joined with `ray start --address ... --resources='{"preemptible": 1}'`;
`rlboost train` joins them with cluster.address, transfer.bind_host=0.0.0.0, a secret and
trainer.rendezvous=tcp. Mid-step the preemptible node's raylet and workers are killed by
their process ids: the run completes on the reserved node with every sample trained on
exactly once, and records the node's instance as a death, with no restart (the controller
and the trainer live on the reserved node).

The test starts and stops only its own nodes (`ray start --block` children, their process
trees, a temporary folder of their own); it never runs `ray stop`, which would stop every
Ray process on the machine.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from own_processes import (
    descendants,
    finish,
    jsonl,
    kill_below,
    kill_leftovers,
    name_of,
    rlboost,
    started_at,
    wait_until,
)

GROUPS, GROUP_SIZE, STEPS = 8, 4, 3
START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _node_env() -> dict[str, str]:
    env = dict(os.environ)
    # Ray refuses a second node while this is 0 ("Multi-node Ray clusters are not supported
    # on Windows and OSX"), on Linux too; the nodes then use the machine's address.
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    # Ray's token authentication, with a token of this test's own (not ~/.ray/auth_token)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    return env


class RayNodes:
    """`ray start --block` processes of this test (the head first) and their logs."""

    def __init__(self, folder: Path, env: dict[str, str]):
        self.folder, self.env = folder, env
        self.starts: list[subprocess.Popen] = []
        self.address: str | None = None

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = self.folder / f"{name}.log"
        # free ports for what would otherwise take a fixed default one another cluster may hold
        ports = [f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={_free_port()}"]
        with log.open("w") as out:  # the node writes to it; this process needs no handle of its own
            proc = subprocess.Popen(
                ["ray", "start", "--block", "--disable-usage-stats", f"--temp-dir={self.folder / 'ray'}",
                 "--object-store-memory=100000000", *ports, *args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts.append(proc)
        wait_until(lambda: "Ray runtime started" in log.read_text(), START_TIMEOUT_S, f"{name} node started", proc)
        return proc

    def start_head(self, reserved: int) -> str:
        self.start("head", "--head", f"--port={_free_port()}", "--num-cpus=2", "--include-dashboard=false",
                   f"--resources={{\"reserved\": {reserved}}}")
        found = re.search(r"ray start --address='([^']+)'", (self.folder / "head.log").read_text())
        assert found, (self.folder / "head.log").read_text()[-2000:]
        self.address = found.group(1)
        return self.address

    def stop(self) -> None:
        """SIGTERM each `ray start` (it stops its node's processes), then kill what is left."""
        left = {pid: started_at(pid) for p in self.starts for pid in [p.pid, *descendants(p.pid)]}
        for p in reversed(self.starts):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.starts:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        kill_leftovers(left)


@contextmanager
def two_nodes(preemptible: int) -> Iterator[tuple[RayNodes, subprocess.Popen]]:
    """A head node (reserved) and a preemptible node; yields the nodes and the preemptible
    node's `ray start` process."""
    folder = Path(tempfile.mkdtemp(prefix="rlb2n-"))  # short: Ray's socket paths must fit
    nodes = RayNodes(folder, _node_env())
    try:
        address = nodes.start_head(reserved=3)  # 2 trainer ranks and the reserved engine
        worker = nodes.start("preemptible", f"--address={address}", "--num-cpus=1",
                             f"--resources={{\"preemptible\": {preemptible}}}")
        yield nodes, worker
    finally:
        nodes.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _spot_busy(run: Path) -> bool:
    """A step has finished since the preemptible instance was active, with tokens of it."""
    return any(m.get("tokens_per_instance", {}).get("spot-s0", 0) > 0 for m in jsonl(run / "metrics.jsonl"))


def test_a_preemptible_node_that_dies_mid_step_loses_no_sample(tmp_path):
    with two_nodes(preemptible=1) as (nodes, worker):
        env = dict(nodes.env, RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
                   RLBOOST_SECRET=secrets.token_hex(16))
        env.pop("RLBOOST_RAY_ADDRESS", None)
        args = [f"cluster.address={nodes.address}", "transfer.bind_host=0.0.0.0", "trainer.rendezvous=tcp",
                f"run.steps={STEPS}", "run.progress=false", "run.checkpoint_every=10", "model.warmup_steps=10",
                f"task.groups_per_step={GROUPS}", f"task.group_size={GROUP_SIZE}", "trainer.microbatch_groups=2",
                "rollout.capacity=16", "cluster.capacity=trace", "cluster.trace=none", "cluster.max_preemptible=1",
                "cluster.initial_preemptible=1",  # placed by the run itself, not by live capacity
                "trainer.world_size=1",  # the node that dies holds an instance, not a rank
                # emulated engines that take about five seconds per step, so the node dies mid-step
                "rollout.backend=emulated", "task.max_new_tokens=24", "rollout.emulated.decode_tokens_per_s=200",
                "rollout.emulated.sample_tokens_per_s=5", "rollout.emulated.stop_probability=0.01"]
        proc = rlboost([a for arg in args for a in ("--set", arg)], tmp_path, env)
        run = wait_until(lambda: next((tmp_path / "runs").glob("*/events.jsonl"), None), 300, "run directory",
                         proc).parent
        wait_until(lambda: _spot_busy(run), 400, "a step with tokens of the preemptible node", proc)
        time.sleep(1.0)  # aims the kill one second into the next step (no condition is awaited)
        raylet = [p for p in descendants(worker.pid) if name_of(p) == "raylet"]
        assert len(raylet) == 1
        on_head = set(descendants(nodes.starts[0].pid))
        kill_below(worker.pid, [raylet[0], *descendants(raylet[0])])  # the node's raylet and its workers

        code, out, err = finish(proc, 400)
        assert code == 0, f"rlboost train exited {code}:\n{err[-4000:]}"
        assert Path(out.strip().splitlines()[-1]) == run
    metrics = jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:  # every sample of every step trained on exactly once
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == GROUPS * GROUP_SIZE
        assert m["duplicates"] == 0 and m["gaps"] == 0 and m["sample_versions"] == [m["step"]]
    events = jsonl(run / "events.jsonl")
    deaths = [e for e in events if e["kind"] == "death"]
    assert [(e["instance"], e["reason"]) for e in deaths] == [("spot-s0", "lost")]
    assert not [e for e in events if e["kind"] == "restart"]  # the reserved node's processes lived on
    processes = next(e for e in events if e["kind"] == "processes")
    assert processes["controller"]["pid"] in on_head  # placed on the reserved node, beside trainer rank 0
    summary = (run / "summary.md").read_text()
    assert "| samples lost | 0 |" in summary and "| preemptions survived | 1 (0 with notice, 1 sudden) |" in summary
