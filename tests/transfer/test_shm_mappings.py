"""Same-host pulls map the source's memfd region read-only; those mappings must not keep
memory alive once nobody uses them: they go after a short idle period, or as soon as the
source retires the region (here: the source process exits)."""

from __future__ import annotations

import pytest

from rlboost.transfer import WeightPuller

from .helpers import BUILT_TRANSPORTS, SECRET, assert_same, make_config, random_tensors, wait_until
from .serve_weights import payload

pytestmark = pytest.mark.skipif("shm" not in BUILT_TRANSPORTS, reason="shm transport not built")


def remote_mappings() -> list[str]:
    """Address ranges of read-only shared mappings of weight regions in this process."""
    with open("/proc/self/maps") as f:
        return [line.split()[0] for line in f
                if "rlboost-weights" in line and line.split()[1] == "r--s"]


def test_idle_mapping_is_dropped_while_the_source_still_serves(publisher):
    tensors = random_tensors()
    publisher.publish(1, tensors)
    with WeightPuller(publisher.address, make_config(transport="shm")) as puller:
        pulled = puller.pull(1, timeout=30)
        assert_same(pulled, tensors)
        assert len(remote_mappings()) == 1
        del pulled
    assert wait_until(lambda: not remote_mappings()), remote_mappings()


def test_back_to_back_pulls_reuse_one_mapping(publisher):
    tensors = random_tensors()
    publisher.publish(1, tensors)
    before = set(remote_mappings())  # earlier tests' mappings may still be idling
    with WeightPuller(publisher.address, make_config(transport="shm")) as puller:
        assert_same(puller.pull(1, timeout=30), tensors)
        first = set(remote_mappings()) - before
        assert_same(puller.pull(1, timeout=30), tensors)
        assert set(remote_mappings()) - before == first and len(first) == 1


def test_mapping_is_dropped_when_the_source_process_exits(server_processes):
    server = server_processes(1 << 20)
    with WeightPuller(server.address, make_config(transport="shm", secret=SECRET)) as puller:
        pulled = puller.pull(1, timeout=30)
        assert bytes(pulled["blob"].numpy()) == bytes(payload(1 << 20, 0).numpy())
        del pulled
    server.kill()
    assert wait_until(lambda: not remote_mappings()), remote_mappings()
