"""The connect handshake proves the client first and keys a MAC over every later frame:
a stranger learns nothing to test secret guesses against, a server without the secret
is refused, and an on-path swap of weights (manifest and chunk rewritten to agree) is
caught by the manifest frame's MAC (IntegrityError) instead of loading the attacker's bytes."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from rlboost import _C, _C_testing
from rlboost.errors import AuthError, IntegrityError, ProtocolError
from rlboost.transfer import WeightPuller

from .helpers import make_config
from .wire_client import (
    HEADER,
    W,
    connect,
    frame,
    hello_body,
    is_closed_by_peer,
    proof,
    recv_frame,
    recv_sealed,
    server_handshake_rest,
)


def test_server_proves_nothing_to_a_client_that_has_not_proven_itself(served):
    pub, _ = served
    with connect(pub.address) as s:
        s.sendall(frame(W["hello"], hello_body(bytes(32), 0)))  # a nonce and client id the client chose
        ftype, _, _, body = _C_testing.parse_frame(recv_frame(s))
        assert ftype == W["challenge"] and len(body) == 32  # a fresh nonce, no proof over ours
        s.sendall(frame(W["auth"], proof(b"a guess", b"rlboost-client-proof-v2", bytes(32), body)))
        with pytest.raises(AuthError):
            _C_testing.parse_frame(recv_frame(s))  # refused, and still no server proof
        assert is_closed_by_peer(s)


def test_server_without_the_secret_is_refused(served):
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            hello = recv_frame(conn)[W["header_bytes"]:]
            try:
                server_handshake_rest(conn, b"not-the-secret", hello, bytes(32))
                recv_frame(conn)
            except (ConnectionError, OSError):
                pass

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    with WeightPuller(address, make_config(reconnect_attempts=0)) as puller:
        with pytest.raises(AuthError):
            puller.pull(1, timeout=30)
    listener.close()
    t.join(timeout=10)


def test_old_wire_format_peer_gets_a_typed_error(served):
    pub, _ = served
    with connect(pub.address) as s:
        s.sendall(frame(W["hello"], bytes(32), fmt=1))
        with pytest.raises(ProtocolError, match="wire format version 1"):
            _C_testing.parse_frame(recv_frame(s))


class WeightSwappingProxyForTests:
    """An on-path attacker between a puller and a real source: forwards every frame, but
    flips a byte of chunk 0 and rewrites the manifest's tag of chunk 0 (and the manifest's
    own checksum): without the secret it cannot recompute the manifest's session MAC."""

    def __init__(self, upstream: str, payload: bytes):
        self.upstream, self.payload = upstream, payload  # an attacker who saw the bytes
        self.tampered = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for s in self._socks:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = connect(self.upstream)
            self._socks += [down, up]
            threading.Thread(target=self._pump, args=(down, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        frames = 0
        try:
            while True:
                head, body, tag = recv_sealed(src, frames >= 2)  # login frames carry no tag
                frames += 1
                magic, fmt, ftype, status, length, rid = HEADER.unpack(head)
                if from_server:
                    body = self._rewrite(ftype, body)
                dst.sendall(HEADER.pack(magic, fmt, ftype, status, len(body), rid) + body + tag)
        except (ConnectionError, OSError):
            src.close()
            dst.close()

    def _rewrite(self, ftype: int, body: bytes) -> bytes:
        if ftype == W["chunk"] and struct.unpack_from("<I", body, 8)[0] == 0 and len(body) > 16:
            return body[:16] + bytes([body[16] ^ 0xFF]) + body[17:]
        if ftype == W["manifest"] and _C.crc32c(body[:-4], 0) == struct.unpack("<I", body[-4:])[0]:
            self.tampered.set()
            return self._swap_tag0(body)
        return body

    def _swap_tag0(self, manifest: bytes) -> bytes:
        m = _C.Manifest.decode(manifest)
        tags = bytes(16) + m.tags[16:]  # the attacker's best guess at chunk 0's new tag
        return _C.Manifest(version=m.version, total_bytes=m.total_bytes, chunk_bytes=m.chunk_bytes,
                           tags=tags, meta=m.meta).encode()


def test_on_path_weight_swap_is_caught_by_the_manifest_frames_mac(served):
    pub, blob = served
    proxy = WeightSwappingProxyForTests(pub.address, blob.numpy().tobytes())
    try:
        with WeightPuller(proxy.address, make_config(transport="tcp", reconnect_attempts=0)) as puller:
            with pytest.raises(IntegrityError, match="MAC"):
                puller.pull(1, timeout=30)
        assert proxy.tampered.is_set()
    finally:
        proxy.close()
