"""transfer.encrypt: with "on" (or "auto" off loopback) every frame and chunk is sealed with
AES-256-GCM, so the weights never cross the wire in clear, and a flipped ciphertext byte
fails the pull (IntegrityError) instead of landing; either side asking is enough. A build
without libcrypto refuses "on" in one line and warns once when "auto" would send clear
text off loopback."""

from __future__ import annotations

import socket
import threading
import warnings

import pytest
import torch

from rlboost import _C
from rlboost.errors import IntegrityError
from rlboost.transfer import TransferConfig, WeightPublisher, WeightPuller
from rlboost.transfer import config as transfer_config

from .helpers import make_config
from .proxies import PumpingProxyForTests, shut

needs_aead = pytest.mark.skipif(not _C.HAS_AEAD, reason="built without libcrypto (HAS_AEAD False)")


class SniffingProxyForTests(PumpingProxyForTests):
    """Forwards bytes both ways unparsed, keeps what the source sent, and (when flip_at is
    set) flips the byte at that offset of each connection's source-to-puller stream."""

    def __init__(self, upstream: str, flip_at: int | None = None):
        super().__init__(upstream)
        self.flip_at, self.seen, self._lock = flip_at, bytearray(), threading.Lock()
        self._start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_source: bool) -> None:
        offset = 0
        try:
            while data := src.recv(1 << 16):
                if from_source:
                    data = bytearray(data)
                    if self.flip_at is not None and offset <= self.flip_at < offset + len(data):
                        data[self.flip_at - offset] ^= 0x01
                    with self._lock:
                        self.seen += data
                offset += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            shut(src, dst)


def _payload() -> torch.Tensor:
    return torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))


def _visible(seen: bytes, blob: torch.Tensor) -> bool:
    raw = bytes(blob.numpy())
    return any(raw[i:i + 64] in seen for i in range(0, len(raw) - 64, len(raw) // 16))


@needs_aead
@pytest.mark.parametrize("server, client", [("on", "on"), ("on", "off"), ("off", "on")])
def test_encrypted_pulls_are_byte_identical_and_never_clear_on_the_wire(server, client):
    blob = _payload()
    with WeightPublisher(make_config(encrypt=server)) as pub:
        pub.publish(1, {"blob": blob})
        proxy = SniffingProxyForTests(pub.address)
        try:
            with WeightPuller(proxy.address, make_config(transport="tcp", relay=False, encrypt=client)) as puller:
                assert torch.equal(puller.pull(1, timeout=30)["blob"], blob)
        finally:
            proxy.close()
        assert pub.stats()["encrypted_connections"] >= 2
    assert len(proxy.seen) > blob.numel() and not _visible(bytes(proxy.seen), blob)


def test_auto_on_loopback_and_off_send_clear_bytes_that_their_tags_still_check():
    blob = _payload()
    with WeightPublisher(make_config()) as pub:
        pub.publish(1, {"blob": blob})
        proxy = SniffingProxyForTests(pub.address)
        try:
            with WeightPuller(proxy.address, make_config(transport="tcp", relay=False, encrypt="off")) as puller:
                assert torch.equal(puller.pull(1, timeout=30)["blob"], blob)
        finally:
            proxy.close()
        assert pub.stats()["encrypted_connections"] == 0
    assert _visible(bytes(proxy.seen), blob)


@needs_aead
def test_a_flipped_ciphertext_byte_fails_the_pull_with_an_integrity_error():
    blob = _payload()
    with WeightPublisher(make_config(encrypt="on")) as pub:
        pub.publish(1, {"blob": blob})
        proxy = SniffingProxyForTests(pub.address, flip_at=200_000)
        try:
            with WeightPuller(proxy.address, make_config(transport="tcp", relay=False, encrypt="on",
                                                         reconnect_attempts=0)) as puller:
                with pytest.raises(IntegrityError):
                    puller.pull(1, timeout=30)
        finally:
            proxy.close()


def test_without_libcrypto_on_is_refused_and_auto_warns_once_off_loopback(monkeypatch):
    monkeypatch.setattr(transfer_config, "_has_aead", lambda: False)
    monkeypatch.setattr(transfer_config, "_warned_clear_text", False)
    with pytest.raises(ValueError, match="encrypt.*libcrypto"):
        TransferConfig(encrypt="on")
    config = make_config(relay=False)
    with pytest.warns(UserWarning, match="clear text"):
        WeightPuller("192.0.2.1:9", config).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WeightPuller("192.0.2.1:9", config).close()  # once per run
