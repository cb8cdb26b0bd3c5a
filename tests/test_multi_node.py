"""What a run across machines needs: servers bound to every interface advertise an address
peers can dial (in a Ray actor: its node's address), and a config that joins a Ray cluster
is refused, by field, when its servers listen on loopback only, or meet in
a file no other node sees."""

from __future__ import annotations

import pytest
import ray
import torch

from rlboost.cluster.session import RaySession, RaySettings, actor_options
from rlboost.config.overrides import apply_overrides
from rlboost.config.run import check_multi_node
from rlboost.recipes import get_recipe
from rlboost.trainer.rank import RankSpec, TrainerRank
from rlboost.transfer import TransferConfig, WeightPublisher, WeightPuller
from rlboost.transfer.config import parse_address


def test_a_wildcard_bind_advertises_a_host_peers_can_dial():
    config = TransferConfig(bind_host="0.0.0.0", secret=b"s")
    weights = {"w": torch.arange(64, dtype=torch.float32)}
    with WeightPublisher(config) as pub:
        host, _ = parse_address(pub.address)
        assert host not in ("0.0.0.0", "::", "")
        pub.publish(1, weights)
        with WeightPuller(pub.address, config) as puller:
            assert parse_address(puller.relay_address)[0] == host
            assert torch.equal(puller.pull(1)["w"], weights["w"])


def test_advertise_host_wins_and_must_be_dialable():
    with WeightPublisher(TransferConfig(bind_host="0.0.0.0", secret=b"s", advertise_host="127.0.0.1")) as pub:
        assert pub.address.startswith("127.0.0.1:")
    with WeightPublisher(TransferConfig()) as pub:  # loopback: the bound host itself
        assert pub.address.startswith("127.0.0.1:")
    with pytest.raises(ValueError, match="advertise_host"):
        TransferConfig(bind_host="0.0.0.0", secret=b"s", advertise_host="0.0.0.0")


def test_the_trainer_publisher_bound_to_every_interface_advertises_its_ray_node():
    class RankOnANodeForTests(TrainerRank):  # defined here so Ray ships it by value
        """A trainer rank that also says which Ray node it runs on."""

        def node_address(self) -> str:
            return ray.util.get_node_ip_address()

    with RaySession(RaySettings(num_cpus=1, reserved=1, preemptible=1, object_store_mb=128)):
        def publisher_host(transfer: TransferConfig) -> tuple[str, str]:
            spec = RankSpec(rank=0, world_size=1, checkpoint="/unused", transfer=transfer)
            rank = ray.remote(RankOnANodeForTests).options(**actor_options("reserved")).remote(spec)
            try:
                return parse_address(ray.get(rank.address.remote(), timeout=60))[0], \
                    ray.get(rank.node_address.remote(), timeout=60)
            finally:
                ray.kill(rank)

        host, node = publisher_host(TransferConfig(bind_host="0.0.0.0", secret=b"s"))
        assert host == node  # the node's address, not the machine's outgoing interface
        named = TransferConfig(bind_host="0.0.0.0", secret=b"s", advertise_host="localhost")
        assert publisher_host(named)[0] == "localhost"  # an explicit advertise_host still wins


JOIN = ["cluster.address=10.0.0.1:6379"]


def test_joining_a_cluster_needs_reachable_servers_and_a_shared_rendezvous(monkeypatch):
    monkeypatch.delenv("RLBOOST_SECRET", raising=False)  # the run's own secret reaches every node through Ray
    tiny = get_recipe("tiny_cpu")
    with pytest.raises(ValueError, match=r"transfer\.bind_host"):
        apply_overrides(tiny, JOIN)
    wide = apply_overrides(get_recipe("tiny_cpu"), ["transfer.bind_host=0.0.0.0"])
    with pytest.raises(ValueError, match=r"trainer\.rendezvous_dir"):
        apply_overrides(wide, JOIN)
    assert apply_overrides(wide, ["trainer.rendezvous=tcp", *JOIN]).cluster.address == "10.0.0.1:6379"
    shared = apply_overrides(wide, ["trainer.rendezvous_dir=/shared/rdzv", *JOIN])
    assert shared.trainer.rendezvous_dir == "/shared/rdzv"
    assert apply_overrides(tiny, ["run.steps=2"]).cluster.address is None  # one machine: as before


def test_an_address_from_the_environment_gets_the_same_checks_before_anything_starts(tmp_path, monkeypatch):
    from rlboost.cluster.session import join_address
    from rlboost.run.job import train

    monkeypatch.setenv("RLBOOST_RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.delenv("RLBOOST_SECRET", raising=False)
    assert join_address(None) == "10.0.0.1:6379" and join_address("10.0.0.2:6379") == "10.0.0.2:6379"
    tiny = get_recipe("tiny_cpu")  # a one-machine recipe: still editable with --set
    with pytest.raises(ValueError, match=r"transfer\.bind_host.*RLBOOST_RAY_ADDRESS"):
        train(tiny)
    wide = apply_overrides(get_recipe("tiny_cpu"), ["transfer.bind_host=0.0.0.0"])
    with pytest.raises(ValueError, match=r"trainer\.rendezvous_dir"):
        train(wide)
    check_multi_node(apply_overrides(wide, ["trainer.rendezvous=tcp"]))  # what train would then accept
    assert not (tmp_path / "runs").exists() and not ray.is_initialized()  # no run directory, no Ray
