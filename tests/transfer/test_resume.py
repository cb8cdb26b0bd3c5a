"""Losing a source mid-pull: the puller finishes from another source (or a restarted one)
without fetching again the chunks it already holds."""

import pytest
import torch

from rlboost.errors import PeerLost
from rlboost.transfer import WeightPuller

from .helpers import CHUNK, make_config, wait_for_bytes, wait_for_chunks_from
from .serve_weights import payload

NBYTES = 64 * CHUNK


def test_killed_source_falls_back_to_the_other_without_refetching(server_processes):
    a = server_processes(NBYTES, seed=3, egress=1_000_000)
    b = server_processes(NBYTES, seed=3, egress=1_000_000)
    cfg = make_config(transport="tcp", streams=2, max_in_flight=1)
    with WeightPuller([a.address, b.address], cfg) as puller:
        handle = puller.prepare(1).start()
        wait_for_bytes(handle, NBYTES // 4)
        # Kill a only once it has served: on a slow machine (or under a sanitizer) b can
        # carry the first quarter alone, and then the kill tests nothing.
        wait_for_chunks_from(handle, a.address)
        a.kill()
        pulled = handle.wait(timeout=60)
    assert torch.equal(pulled["blob"], payload(NBYTES, 3))
    stats = pulled.stats
    by_address = {s["address"]: s for s in stats["sources"]}
    assert by_address[a.address]["chunks"] > 0 and by_address[b.address]["chunks"] > 0
    assert stats["chunks_fetched"] == 64 and stats["refetched"] == 0
    # Beyond one request per chunk, only the reads in flight on the killed source repeat.
    assert stats["chunk_requests"] <= 64 + cfg.streams * cfg.max_in_flight


def test_only_source_killed_raises_peer_lost_then_retry_fetches_only_missing(server_processes):
    a = server_processes(NBYTES, seed=4, egress=1_000_000)
    with WeightPuller(a.address, make_config(transport="tcp")) as puller:
        handle = puller.prepare(1).start()
        wait_for_bytes(handle, NBYTES // 3)
        a.kill()
        with pytest.raises(PeerLost):
            handle.wait(timeout=60)
        held_chunks = handle.bytes_done // CHUNK
        assert 0 < held_chunks < 64
        restarted = server_processes(NBYTES, seed=4)
        pulled = puller.pull(1, sources=[restarted.address], timeout=60)
    assert torch.equal(pulled["blob"], payload(NBYTES, 4))
    assert pulled.stats["chunks_fetched"] == 64 - held_chunks
    assert pulled.stats["refetched"] == 0
