"""Bounds that bound: a run derives transfer.max_version_bytes from the model it trains, so
a source holding the secret cannot make a puller take a 2 GiB version of a small model; and
under any bound a manifest frame costs memory only as its bytes arrive, so a party on the
path without the secret cannot make a puller hold 128 MiB by announcing it."""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest

from rlboost.errors import ProtocolError, TransferError
from rlboost.transfer import WeightPuller
from rlboost.transfer.config import checkpoint_payload_bytes, version_bytes_bound

from .helpers import SECRET, make_config
from .wire_client import HostileSourceForTests

MiB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _tiny_checkpoint(directory) -> None:
    header = json.dumps({"w": {"dtype": "BF16", "shape": [1024, 1024], "data_offsets": [0, 2 * MiB]},
                         "b": {"dtype": "F32", "shape": [1024], "data_offsets": [2 * MiB, 2 * MiB + 4096]}}).encode()
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(2 * MiB + 4096))


def test_a_run_bounds_its_versions_by_its_model(tmp_path):
    from rlboost.config.run import RunConfig
    from rlboost.run.launch import version_bound

    _tiny_checkpoint(tmp_path)
    payload = checkpoint_payload_bytes(tmp_path, alignment=4096)
    assert 4 * MiB <= payload < 5 * MiB  # bf16 counted at 4 bytes an element (a float32 publish)
    bound = version_bound(RunConfig(), tmp_path)  # what `rlboost train` hands its pullers
    assert bound == version_bytes_bound(payload) and payload < bound < 2 << 30
    source = HostileSourceForTests("huge_version", SECRET, bytes(4096))
    try:
        before = _rss()
        with WeightPuller(source.address, make_config(transport="tcp", relay=False, reconnect_attempts=0,
                                                      max_version_bytes=bound)) as puller:
            with pytest.raises(ProtocolError, match="max_version_bytes"):
                puller.pull(1, timeout=20)
        assert _rss() - before < 64 * MiB
    finally:
        source.close()


def test_an_announced_manifest_costs_only_the_bytes_that_arrive():
    # The default bound (1 TiB) admits a 100 MiB manifest frame; the source announces one
    # and sends nothing of it.
    source = HostileSourceForTests("huge_manifest", SECRET, bytes(4096))
    before, peak, done = _rss(), [0], threading.Event()

    def watch() -> None:  # the peak while the pull waits for the body (freed memory leaves RSS after)
        while not done.wait(0.01):
            peak[0] = max(peak[0], _rss())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with WeightPuller(source.address, make_config(transport="tcp", relay=False, reconnect_attempts=0,
                                                      request_timeout_s=2.0, resolve_timeout_s=2.0)) as puller:
            with pytest.raises(TransferError):
                puller.pull(1, timeout=20)
    finally:
        done.set()
        watcher.join()
        source.close()
    assert peak[0] - before < 64 * MiB
