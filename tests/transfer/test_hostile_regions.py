"""Hostile announcements cannot hang, bloat or crash a puller: a shared-memory reply that
points at a FIFO (rewritten on the path, or sent by a source that holds the secret) fails
with a typed error within the pull's deadline and close() returns at once; a version or a
manifest larger than transfer.max_version_bytes allows is refused before anything is
allocated for it."""

from __future__ import annotations

import os
import struct
import tempfile
import threading

import pytest
import torch

from rlboost.errors import IntegrityError, ProtocolError
from rlboost.transfer import WeightPublisher, WeightPuller

from .helpers import SECRET, make_config
from .proxies import TaggedProxyForTests
from .wire_client import HostileSourceForTests, W

MiB = 1 << 20


def _returns_within(fn, seconds: float) -> bool:
    """Whether fn() returns within `seconds` (a hang check: fn keeps running otherwise)."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def fifo_fd():
    """An O_PATH descriptor of a named FIFO nobody writes to: opening it to read blocks."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fifo")
        os.mkfifo(path)
        fd = os.open(path, os.O_PATH)
        try:
            yield fd
        finally:
            os.close(fd)


def _pull_fails_and_closes(address: str, error: type, timeout: float = 10.0) -> None:
    puller = WeightPuller(address, make_config(transport="shm", relay=False, reconnect_attempts=0))
    result: list[BaseException] = []

    def pull() -> None:
        try:
            puller.pull(1, timeout=timeout)
        except BaseException as exc:  # recorded: checked below
            result.append(exc)

    assert _returns_within(pull, timeout + 5), "the pull hung past its deadline"
    assert len(result) == 1 and isinstance(result[0], error), result
    assert _returns_within(puller.close, 1.0), "close() hung"


def test_an_shm_reply_rewritten_on_the_path_to_a_fifo_fails_fast(fifo_fd):
    blob = torch.randint(0, 256, (300_000,), dtype=torch.uint8)
    with WeightPublisher(make_config()) as pub:
        pub.publish(1, {"blob": blob})

        def to_fifo(ftype: int, body: bytes) -> bytes:
            if ftype == W["shm_open"] and len(body) == 16:
                return struct.pack("<IIQ", os.getpid(), fifo_fd, struct.unpack("<Q", body[8:])[0])
            return body

        proxy = TaggedProxyForTests(pub.address, to_fifo)
        try:
            _pull_fails_and_closes(proxy.address, IntegrityError)
            assert proxy.rewritten >= 1
        finally:
            proxy.close()


def test_a_source_with_the_secret_pointing_shm_at_a_fifo_fails_fast(fifo_fd):
    source = HostileSourceForTests("fifo_region", SECRET, bytes(range(256)) * 100, region_fd=fifo_fd)
    try:
        _pull_fails_and_closes(source.address, ProtocolError)
    finally:
        source.close()


@pytest.mark.parametrize("behavior", ["huge_version", "huge_manifest"])
def test_an_announcement_past_max_version_bytes_is_refused_before_allocation(behavior):
    source = HostileSourceForTests(behavior, SECRET, bytes(4096))
    try:
        before = _rss()
        with WeightPuller(source.address, make_config(transport="tcp", relay=False, reconnect_attempts=0,
                                                      max_version_bytes=256 * MiB)) as puller:
            with pytest.raises(ProtocolError, match="max_version_bytes"):
                puller.pull(1, timeout=20)
        assert _rss() - before < 64 * MiB
    finally:
        source.close()
