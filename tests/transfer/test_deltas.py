"""Delta updates end to end: a puller that holds version k takes delta(k -> k+1) from any
source that has it (trainer or relay) and ends with k+1's exact bytes; a newcomer, a
puller too far behind, a missing, declined or corrupt delta, or a tampered base all end
in the full version, never in other weights. A test that expects the delta route waits
for the publisher to have encoded it (wait_for_deltas): a pull waits only delta_wait_s,
which busy cores can outlast."""

import hashlib

import pytest
import torch

from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller
from rlboost.transfer.delta import delta_key

from .helpers import assert_same, corrupt_served_byte, make_config

WAIT = 20.0


class Trainer:
    """A bf16 model whose float32 master weights take one Adam-sized step (lr * sign) per
    version, as a trainer publishing each step would: most bf16 values do not change."""

    def __init__(self, seed: int = 0, lr: float = 1e-5):
        self.g = torch.Generator().manual_seed(seed)
        self.lr = lr
        self.master = {"embed.weight": torch.randn(512, 96, generator=self.g) * 0.02,
                       "layers.0.mlp.weight": torch.randn(96, 384, generator=self.g) * 0.02,
                       "norm.weight": torch.ones(96)}

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.to(torch.bfloat16) for k, v in self.master.items()}

    def step(self) -> dict[str, torch.Tensor]:
        for v in self.master.values():
            v += self.lr * torch.sign(torch.randn(v.shape, generator=self.g))
        return self.weights()


def _config(**overrides):
    return make_config(delta_chunk_bytes=4096, **overrides)


def _digest(pulled) -> str:
    return hashlib.sha256(pulled.buffer[: pulled.manifest.total_bytes].numpy().tobytes()).hexdigest()


def _trainer_bytes(pulled, publisher) -> int:
    return sum(s["bytes"] for s in pulled.stats["sources"] if s["address"] == publisher.address)


def test_a_puller_that_holds_the_previous_version_pulls_only_the_delta():
    trainer = Trainer()
    with WeightPublisher(_config()) as pub, WeightPuller(pub.address, _config()) as puller:
        pub.publish(1, trainer.weights())
        pulled = puller.pull(1)
        assert pulled.stats["route"] == "full"
        expected = trainer.step()
        assert pub.publish(2, expected).delta_base == 1
        assert pub.wait_for_deltas(WAIT)
        pulled = puller.pull(2, into=pulled, timeout=WAIT)
        assert_same(pulled, expected)
        assert pulled.stats["route"] == "delta" and pulled.stats["deltas"] == 1
        assert pulled.stats["bytes"] == pulled.stats["delta_bytes"] < pulled.manifest.total_bytes / 5
        (record,) = [d for d in pub.delta_stats() if d["target"] == 2]
        assert record["bytes"] == pulled.stats["delta_bytes"] and not record["declined"]


def test_100_chained_deltas_give_the_bytes_of_a_full_pull():
    trainer = Trainer(seed=1)
    with WeightPublisher(_config()) as pub, WeightPuller(pub.address, _config()) as follower:
        pub.publish(1, trainer.weights())
        pulled = follower.pull(1)
        routes = []
        for version in range(2, 102):
            pub.publish(version, trainer.step())
            assert pub.wait_for_deltas(WAIT)
            pulled = follower.pull(version, into=pulled, timeout=WAIT)
            routes.append(pulled.stats["route"])
        with WeightPuller(pub.address, _config(relay=False)) as newcomer:
            full = newcomer.pull(101)
        assert routes == ["delta"] * 100 and full.stats["route"] == "full"
        assert _digest(pulled) == _digest(full)
        assert_same(pulled, trainer.weights())


def test_a_newcomer_mid_chain_pulls_the_full_version_then_deltas():
    trainer = Trainer(seed=2)
    with WeightPublisher(_config()) as pub:
        for version in range(1, 4):
            pub.publish(version, trainer.step())
        with WeightPuller(pub.address, _config()) as newcomer:
            pulled = newcomer.pull(3)
            assert pulled.stats["route"] == "full"
            for version in (4, 5):
                expected = trainer.step()
                pub.publish(version, expected)
                assert pub.wait_for_deltas(WAIT)
                pulled = newcomer.pull(version, into=pulled, timeout=WAIT)
                assert_same(pulled, expected)
                assert pulled.stats["route"] == "delta"


def test_a_puller_two_versions_behind_chains_two_deltas():
    trainer = Trainer(seed=3)
    with WeightPublisher(_config()) as pub, WeightPuller(pub.address, _config()) as puller:
        pub.publish(1, trainer.weights())
        pulled = puller.pull(1)
        pub.publish(2, trainer.step())
        # A delta still queued when a newer one is asked for is dropped (it would serve
        # nobody who keeps up), so version 3 is published once the delta into 2 is served,
        # as after a training step, which takes longer than an encode.
        assert pub.wait_for_deltas(WAIT)
        expected = trainer.step()
        pub.publish(3, expected)
        assert pub.wait_for_deltas(WAIT)
        pulled = puller.pull(3, into=pulled, timeout=WAIT)
        assert_same(pulled, expected)
        assert pulled.stats["route"] == "delta" and pulled.stats["deltas"] == 2


def test_a_puller_further_behind_than_the_deltas_served_pulls_the_full_version():
    trainer = Trainer(seed=4)
    config = _config(publisher=ServerConfig(versions_kept=2))
    with WeightPublisher(config) as pub, WeightPuller(pub.address, _config()) as puller:
        pub.publish(1, trainer.weights())
        pulled = puller.pull(1)
        for version in (2, 3, 4):  # the delta into 2 went with version 2
            expected = trainer.step()
            pub.publish(version, expected)
            # deltas are encoded on a thread of their own: on busy cores the one into 3 could
            # otherwise still wait for its base (version 2) when version 4 retires it
            assert pub.wait_for_deltas(WAIT)
        pulled = puller.pull(4, into=pulled, timeout=WAIT)
        assert_same(pulled, expected)
        assert pulled.stats["route"] == "full" and "into version 2" in pulled.stats["fallback"]


def test_a_relay_serves_the_delta_it_pulled_and_the_version_it_rebuilt():
    trainer = Trainer(seed=5)
    with WeightPublisher(_config()) as pub:
        pub.publish(1, trainer.weights())
        with WeightPuller(pub.address, _config()) as relay, WeightPuller(pub.address, _config()) as other:
            held_relay, held_other = relay.pull(1), other.pull(1)
            expected = trainer.step()
            pub.publish(2, expected)
            assert pub.wait_for_deltas(WAIT)
            held_relay = relay.pull(2, into=held_relay, timeout=WAIT)
            assert relay.relayed_deltas == [2] and relay.relayed_versions == [2]
            sent = pub.stats()["bytes_sent"]
            pulled = other.pull(2, into=held_other, sources=[relay.relay_address], timeout=WAIT)
            assert_same(pulled, expected)
            assert pulled.stats["route"] == "delta"
            assert [s["address"] for s in pulled.stats["sources"]] == [relay.relay_address]
            assert pub.stats()["bytes_sent"] == sent  # nothing more from the trainer
            with WeightPuller(relay.relay_address, _config(relay=False)) as newcomer:
                assert_same(newcomer.pull(2), expected)  # the rebuilt version is served whole


def test_a_missing_delta_falls_back_to_the_full_version():
    """A relay that pulled version 2 whole holds no delta; a puller that can reach only it
    waits delta_wait_s for one, then takes the full version."""
    trainer = Trainer(seed=6)
    with WeightPublisher(_config()) as pub:
        pub.publish(1, trainer.weights())
        expected = trainer.step()
        pub.publish(2, expected)
        with WeightPuller(pub.address, _config()) as relay, WeightPuller((), _config(delta_wait_s=0.2)) as puller:
            relay.pull(2)
            held = puller.pull(1, sources=[pub.address])
            pulled = puller.pull(2, into=held, sources=[relay.relay_address], timeout=WAIT)
            assert_same(pulled, expected)
            assert pulled.stats["route"] == "full" and "no source serves a delta" in pulled.stats["fallback"]


def test_a_corrupt_delta_falls_back_to_the_full_version():
    trainer = Trainer(seed=7)
    with WeightPublisher(_config()) as pub, WeightPuller(pub.address, _config()) as puller:
        pub.publish(1, trainer.weights())
        held = puller.pull(1)
        expected = trainer.step()
        pub.publish(2, expected)
        assert pub.wait_for_deltas(WAIT)
        corrupt_served_byte(pub, delta_key(2), 100)
        pulled = puller.pull(2, into=held, timeout=WAIT)
        assert_same(pulled, expected)
        assert pulled.stats["route"] == "full" and "IntegrityError" in pulled.stats["fallback"]
        assert pulled.stats["sources"][0]["integrity_failures"] >= 1


def test_a_base_changed_since_its_pull_is_caught_and_the_full_version_pulled():
    trainer = Trainer(seed=8)
    with WeightPublisher(_config()) as pub, WeightPuller(pub.address, _config(relay=False)) as puller:
        pub.publish(1, trainer.weights())
        held = puller.pull(1)
        held["norm.weight"][3] += 1.0  # the engine (wrongly) wrote into the pulled buffer
        expected = trainer.step()
        pub.publish(2, expected)
        pulled = puller.pull(2, into=held, timeout=WAIT)
        assert_same(pulled, expected)
        assert pulled.stats["route"] == "full" and "differs from its tags" in pulled.stats["fallback"]


def test_a_delta_that_saves_little_is_declined_and_the_full_version_pulled_at_once():
    g = torch.Generator().manual_seed(9)
    with WeightPublisher(_config(delta_wait_s=3600.0)) as pub, \
            WeightPuller(pub.address, _config(delta_wait_s=3600.0)) as puller:
        pub.publish(1, {"w": torch.randn(20000, generator=g)})
        held = puller.pull(1)
        expected = {"w": torch.randn(20000, generator=g)}  # nothing in common
        pub.publish(2, expected)
        pulled = puller.pull(2, into=held, timeout=WAIT)  # would time out if it waited for a delta
        assert_same(pulled, expected)
        assert pulled.stats["route"] == "full" and "declined" in pulled.stats["fallback"]
        assert pub.stats()["held_bytes"] < 4 * pulled.manifest.total_bytes


def test_deltas_off_means_full_pulls_and_no_delta_served():
    trainer = Trainer(seed=10)
    with WeightPublisher(_config(delta=False)) as pub, WeightPuller(pub.address, _config()) as puller:
        pub.publish(1, trainer.weights())
        held = puller.pull(1)
        expected = trainer.step()
        assert pub.publish(2, expected).delta_base is None
        pulled = puller.pull(2, into=held, timeout=WAIT)
        assert_same(pulled, expected)
        assert pulled.stats["route"] == "full" and pub.delta_stats() == []


@pytest.mark.parametrize("field, value", [("delta_threads", 0), ("delta_chunk_bytes", 100), ("delta_wait_s", -1.0),
                                          ("delta_max_chain", 0), ("delta_max_fraction", 0.0), ("delta", "yes")])
def test_bad_delta_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        make_config(**{field: value})
