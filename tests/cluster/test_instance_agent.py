"""The instance agent keeps its lease alive whatever its pull does: a pull that fails is
tried again at the next lease (never in a loop), and a pull that blocks while resolving
its sources does not stop the heartbeats."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
import ray
import torch

from rlboost.cluster.instance import InstanceSpec, RolloutInstance
from rlboost.cluster.session import RaySession, RaySettings, actor_options
from rlboost.controller.records import Lease
from rlboost.errors import TransferTimeout
from rlboost.models import build_tiny_checkpoint
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.transfer import ServerConfig, TransferConfig, WeightPublisher, WeightPuller


@pytest.fixture(scope="module")
def ray_cluster():
    with RaySession(RaySettings(num_cpus=2, reserved=1, preemptible=2, object_store_mb=128)):
        yield


@ray.remote(num_cpus=0)
class LeaseDeskForTests:
    """Stands in for the controller: answers every heartbeat with a lease naming `version`,
    and counts the heartbeats."""

    def __init__(self, version: int, renew_within_s: float):
        self.version, self.renew_within_s = version, renew_within_s
        self.beats = 0
        self._changed = asyncio.Condition()

    def _lease(self, instance_id: str) -> Lease:
        return Lease(instance_id=instance_id, state="pulling", weight_version=self.version,
                     renew_within_s=self.renew_within_s)

    async def register(self, info, engine) -> Lease:
        return self._lease(info.instance_id)

    async def heartbeat(self, instance_id: str, weight_version: int | None = None) -> Lease:
        async with self._changed:
            self.beats += 1
            self._changed.notify_all()
        return self._lease(instance_id)

    async def wait_beats(self, n: int, timeout_s: float) -> int:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.beats >= n), timeout_s)
            except asyncio.TimeoutError:
                pass
            return self.beats

    async def count(self) -> int:
        return self.beats


def _until(predicate, timeout_s: float = 60.0):
    """Wait (polling the actors) until predicate() is true; returns its last value."""
    done = threading.Event()
    for _ in range(int(timeout_s / 0.05)):
        value = predicate()
        if value:
            return value
        done.wait(0.05)
    raise AssertionError("condition not met in time")


def _spec(tmp_path, sources, transfer) -> InstanceSpec:
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=1)
    return InstanceSpec(instance_id="spot-0", kind="preemptible", transfer=transfer, model_dir=str(ckpt),
                        rollout=RolloutConfig(capacity=2, embedded=EmbeddedEngineConfig(num_blocks=16)),
                        sources=tuple(sources))


def _stalled_publisher() -> WeightPublisher:
    """Serves 4 KiB chunks at 1 KiB/s: a puller that waits 0.5 s per chunk fails with its
    own TransferTimeout."""
    pub = WeightPublisher(TransferConfig(secret=b"s", chunk_bytes=4096, publisher=ServerConfig(egress_bytes_per_s=1024),
                                         relay=False))
    pub.publish(1, {"w": torch.zeros(64 << 10, dtype=torch.uint8)})
    return pub


STALLED_PULLER = dict(secret=b"s", chunk_bytes=4096, request_timeout_s=0.5, reconnect_attempts=0, streams=1)


def test_a_failed_pull_is_done_and_a_running_one_is_not():
    with _stalled_publisher() as pub:
        with WeightPuller(pub.address, TransferConfig(**STALLED_PULLER, relay=False)) as p:
            handle = p.prepare(1).start()
            assert handle.poll(timeout=60.0)  # ended: it failed with a native timeout
            assert handle.done
            with pytest.raises(TransferTimeout):
                handle.wait(timeout=0.0)
        slow = TransferConfig(secret=b"s", chunk_bytes=4096, request_timeout_s=300.0, relay=False, streams=1)
        with WeightPuller(pub.address, slow) as p:
            handle = p.prepare(1).start()
            assert not handle.poll(timeout=0.05)  # 64 KiB at 1 KiB/s: still moving bytes
            assert not handle.done
            with pytest.raises(TransferTimeout):
                handle.wait(timeout=0.05)
            assert not handle.done  # a wait that ran out leaves the pull running
            handle.cancel()


def test_a_failed_pull_waits_for_the_next_lease(ray_cluster, tmp_path):
    desk = LeaseDeskForTests.remote(1, 3600.0)  # no beat of its own during the test
    with _stalled_publisher() as pub:
        spec = _spec(tmp_path, [pub.address], TransferConfig(**STALLED_PULLER))
        inst = ray.remote(RolloutInstance).options(**actor_options("preemptible")).remote(spec, desk)
        try:
            _until(lambda: ray.get(inst.pull_errors.remote()))
            # one beat brought the lease; the failure brought no more (a loop on the ended
            # pull would have heartbeated, or pulled, without pause)
            assert ray.get(desk.count.remote()) == 1 and len(ray.get(inst.pull_errors.remote())) == 1
            # the next lease (as the controller pushes one when a version is current): the
            # pull is tried once more
            inst.renew.remote(Lease(instance_id="spot-0", state="pulling", weight_version=1, renew_within_s=3600.0))
            errors = _until(lambda: len(ray.get(inst.pull_errors.remote())) >= 2 and
                            ray.get(inst.pull_errors.remote()))
            assert len(errors) == 2 and all("TransferTimeout" in e for e in errors)
            assert ray.get(desk.count.remote()) == 1
            assert ray.get(inst.pulls.remote()) == []
        finally:
            ray.kill(inst)


def test_heartbeats_go_on_while_a_frozen_peer_blocks_the_pull(ray_cluster, tmp_path):
    frozen = socket.create_server(("127.0.0.1", 0))  # accepts connections, never answers
    address = f"127.0.0.1:{frozen.getsockname()[1]}"
    desk = LeaseDeskForTests.remote(1, 0.2)  # a beat every 0.1 s
    patient = TransferConfig(secret=b"s", connect_timeout_s=300.0, request_timeout_s=300.0)
    inst = ray.remote(RolloutInstance).options(**actor_options("preemptible")).remote(
        _spec(tmp_path, [address], patient), desk)
    try:
        assert ray.get(desk.wait_beats.remote(20, 60.0)) >= 20
        # the resolve is still blocked (its deadlines are minutes away), yet the lease lives
        assert ray.get(inst.pull_errors.remote()) == [] and ray.get(inst.pulls.remote()) == []
    finally:
        frozen.close()
        ray.kill(inst)


def test_an_instance_bound_to_every_interface_advertises_its_node_address(ray_cluster, tmp_path):
    desk = LeaseDeskForTests.remote(0, 3600.0)  # version 0: nothing to pull
    spec = _spec(tmp_path, ["127.0.0.1:9"], TransferConfig(bind_host="0.0.0.0", secret=b"s"))
    inst = ray.remote(RolloutInstance).options(**actor_options("preemptible")).remote(spec, desk)
    try:
        relay = ray.get(inst.ready.remote(), timeout=60)
        assert relay.rpartition(":")[0] == ray.util.get_node_ip_address()  # the Ray node, not 0.0.0.0
    finally:
        ray.kill(inst)
