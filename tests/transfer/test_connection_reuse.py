"""Pullers keep their authenticated connections between pulls: later pulls open none,
connections a source closed meanwhile are replaced without failing (or counting against)
the pull, and a full server closes idle kept connections to admit newcomers."""

import os

import torch

from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import SECRET, make_config
from .wire_client import HostileSourceForTests


def _blob(nbytes: int = 1 << 20) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8)


def test_consecutive_pulls_reuse_the_connections_of_the_first(publisher):
    blob = _blob()
    publisher.publish(1, {"blob": blob})
    cfg = make_config(transport="tcp", relay=False)
    with WeightPuller(publisher.address, cfg) as puller:
        for _ in range(5):
            assert torch.equal(puller.pull(1)["blob"], blob)
            # Every connection opened so far is kept, and none beyond one control
            # connection and one per stream was ever needed.
            assert puller.idle_connections == publisher.stats()["connections_accepted"] <= 1 + cfg.streams
    assert puller.idle_connections == 0  # closed with the puller


def test_without_keep_connections_every_pull_connects_anew(publisher):
    publisher.publish(1, {"blob": _blob()})
    with WeightPuller(publisher.address, make_config(relay=False, keep_connections=False)) as puller:
        puller.pull(1)
        opened = publisher.stats()["connections_accepted"]
        puller.pull(1)
        assert publisher.stats()["connections_accepted"] > opened
        assert puller.idle_connections == 0


def test_connections_the_source_closed_are_replaced_without_a_failure():
    payload = os.urandom(64 * 4096)
    source = HostileSourceForTests("well_behaved", SECRET, payload)
    # No reconnect allowed: a kept connection found closed must not count as one.
    cfg = make_config(transport="tcp", relay=False, reconnect_attempts=0, streams=2)
    try:
        with WeightPuller(source.address, cfg) as puller:
            puller.pull(1, timeout=30)
            kept = puller.idle_connections
            assert kept == source.connections_accepted
            source.drop_open_connections_on_next_request()
            pulled = puller.pull(1, timeout=30)
            assert bytes(pulled["blob"].numpy()) == payload
            assert [s["reconnects"] for s in pulled.stats["sources"]] == [0]
            assert source.connections_accepted > kept  # the closed ones were replaced
    finally:
        source.close()


def test_a_full_server_closes_idle_kept_connections_to_admit_newcomers():
    blob = _blob()
    cfg = make_config(transport="tcp", relay=False, streams=2)
    with WeightPublisher(make_config(publisher=ServerConfig(max_connections=3))) as pub:
        pub.publish(1, {"blob": blob})
        first, second = WeightPuller(pub.address, cfg), WeightPuller(pub.address, cfg)
        try:
            assert torch.equal(first.pull(1)["blob"], blob)  # keeps its connections open
            assert torch.equal(second.pull(1)["blob"], blob)
            assert torch.equal(first.pull(1)["blob"], blob)  # its kept ones were closed
        finally:
            first.close()
            second.close()
        stats = pub.stats()
    # how many a pull keeps depends on how many of its streams got to connect before the
    # small blob was in; newcomers are admitted by evicting idle ones, never refused
    assert stats["connections_refused"] == 0 and stats["connections_evicted"] >= 1
