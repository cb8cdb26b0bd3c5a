"""Instances that die on their own, as processes do: each is recorded as a death with its
reason and the samples it held, and a reserved engine that dies is replaced at once under
its own name, so the next step finds a reserved engine at the current weights."""

from __future__ import annotations

import os

import pytest
import ray
from fleet_lines import FleetLinesForTests
from own_processes import kill_below

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.fleet import Fleet
from rlboost.cluster.instance import InstanceSpec
from rlboost.cluster.session import RaySession, RaySettings, actor_options
from rlboost.controller.actor import RolloutController
from rlboost.controller.config import ControllerConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.embedded.engine import EmbeddedEngineConfig
from rlboost.transfer import TransferConfig, WeightPublisher, new_secret


@pytest.fixture(scope="module")
def ray_cluster():
    with RaySession(RaySettings(num_cpus=2, reserved=2, preemptible=4, object_store_mb=128)):
        yield


def test_a_dead_reserved_engine_is_replaced_and_every_death_is_recorded(ray_cluster, tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=5)
    ctl = RolloutController.options(num_cpus=0).remote(ControllerConfig(
        poll_interval_s=0.02, registry=RegistryConfig(heartbeat_interval_s=0.5, missed_beats=4)))
    rec, ledger = FleetLinesForTests(), CostLedger()
    transfer = TransferConfig(secret=new_secret())  # the run's secret, shared with its instances
    with WeightPublisher(transfer) as pub:
        pub.publish(1, load_pretrained(ckpt).named_weights())
        ray.get(ctl.set_weight_version.remote(1))
        template = InstanceSpec(instance_id="t", kind="preemptible", transfer=transfer, model_dir=str(ckpt),
                                rollout=RolloutConfig(capacity=4, embedded=EmbeddedEngineConfig(num_blocks=64)),
                                sources=(pub.address,))
        fleet = Fleet(ctl, template, lambda kind: actor_options(kind), ledger, rec, lambda: 0.0)
        try:
            for iid, kind in (("reserved-0", "reserved"), ("spot-0", "preemptible"), ("spot-1", "preemptible")):
                fleet.join(iid, kind)
            fleet.wait_version(1, "reserved", 120)
            fleet.wait_version(1, "preemptible", 120)
            active = {i: rec.first(lambda e, i=i: e["kind"] == "active" and e["instance"] == i)
                      for i in ("reserved-0", "spot-0")}
            assert all(a["pid"] > 0 and a["node"] for a in active.values())  # which process each one is

            kill_below(os.getpid(), [active["reserved-0"]["pid"], active["spot-0"]["pid"]])
            for iid in ("reserved-0", "spot-0"):
                death = rec.first(lambda e, i=iid: e["kind"] == "death" and e["instance"] == i)
                assert death["reason"] == "lost" and death["samples_resumed"] == 0
            # a new reserved engine under the same name, at the current weights; the lost
            # preemptible instance is not replaced (the trace decides what joins)
            fleet.wait_version(1, "reserved", 120)
            rec.first(lambda e: e["kind"] == "active" and e["instance"] == "reserved-0"
                     and e["pid"] != active["reserved-0"]["pid"])
            assert [e["kind"] for e in rec.of("reserved-0")] == ["join", "active", "death", "join", "active"]
            assert [e["kind"] for e in rec.of("spot-0")] == ["join", "active", "death"] and fleet.up("reserved") == 1

            fleet.kill("spot-1")  # a sudden preemption: the run killed it
            assert rec.first(lambda e: e["kind"] == "death" and e["instance"] == "spot-1")["reason"] == "killed"
            assert fleet.up() == 0 and "spot-0" not in ledger.running()  # billing stopped at its death
        finally:
            fleet.close()
            ray.get(ctl.close.remote())
            ray.kill(ctl)
