"""Bad input gets a typed error and disturbs nobody else: hostile frames sent to a real
server, a wrong secret, unknown versions, a corrupted chunk, and a source that lies."""

import socket
import struct

import pytest
import torch

from rlboost import _C_testing
from rlboost.errors import AuthError, IntegrityError, PeerLost, ProtocolError, VersionMismatch
from rlboost.transfer import WeightPublisher, WeightPuller

from .helpers import SECRET, corrupt_served_byte, make_config
from .wire_client import HostileSourceForTests, W, client_handshake, connect, frame, is_closed_by_peer, recv_frame


def good_pull_works(address: str, blob: torch.Tensor) -> None:
    with WeightPuller(address, make_config(transport="tcp")) as puller:
        assert torch.equal(puller.pull(1)["blob"], blob)


@pytest.mark.parametrize("raw", [
    frame(W["hello"], bytes(32), magic=0x12345678),                 # bad magic
    frame(W["hello"], bytes(32), fmt=W["format_version"] + 1),      # future format
    frame(W["hello"], b"", length=1 << 31),                         # huge length, no body
    frame(W["hello"], bytes(7)),                                    # wrong body size
    frame(W["chunk"], bytes(16)),                                   # a server frame from a client
    frame(W["chunk"], b"", length=200 << 20),                       # ... announcing a huge body
    frame(999, b""),                                                # unknown type
], ids=["bad-magic", "future-format", "huge-hello", "short-hello", "server-frame", "server-frame-huge",
        "unknown-type"])
def test_hostile_first_frame_gets_protocol_error_and_closed_connection(served, raw):
    pub, blob = served
    with connect(pub.address) as s:
        s.sendall(raw)
        with pytest.raises(ProtocolError):
            _C_testing.parse_frame(recv_frame(s))
        assert is_closed_by_peer(s)
    assert pub.stats()["protocol_errors"] >= 1
    good_pull_works(pub.address, blob)


def test_truncated_frame_closes_only_that_connection(served):
    pub, blob = served
    with connect(pub.address) as bystander:
        bystander = client_handshake(bystander, SECRET)
        with connect(pub.address) as s:
            s.sendall(frame(W["hello"], bytes(32))[:10])
            s.shutdown(socket.SHUT_WR)
            assert is_closed_by_peer(s)
        # The authenticated bystander connection still answers.
        bystander.sendall(frame(W["manifest_request"], struct.pack("<q", 1), request_id=5))
        ftype, _, rid, _ = _C_testing.parse_frame(recv_frame(bystander))
        assert (ftype, rid) == (W["manifest"], 5)
    good_pull_works(pub.address, blob)


@pytest.mark.parametrize("raw", [
    frame(W["chunk_request"], b"\x01\x02\x03"),                    # short body
    frame(W["manifest_request"], bytes(9)),                          # long body
    frame(W["hello"], bytes(32)),                                    # handshake frame again
    frame(W["chunk_request"], b"", length=W["max_chunk_bytes"]),     # over the request bound
    frame(W["manifest"], b"", length=100 << 20),                     # a server frame, huge body
], ids=["short-body", "long-body", "hello-again", "over-bound", "server-frame-huge"])
def test_hostile_frames_after_authentication(served, raw):
    pub, blob = served
    with connect(pub.address) as s:
        s = client_handshake(s, SECRET)
        s.sendall(raw)
        with pytest.raises(ProtocolError):
            _C_testing.parse_frame(recv_frame(s))
        assert is_closed_by_peer(s)
    good_pull_works(pub.address, blob)


def test_requests_for_unknown_versions_and_chunks_are_answered_not_fatal(served):
    pub, blob = served
    with connect(pub.address) as s:
        s = client_handshake(s, SECRET)
        s.sendall(frame(W["manifest_request"], struct.pack("<q", 42), request_id=1))
        with pytest.raises(VersionMismatch):
            _C_testing.parse_frame(recv_frame(s))
        s.sendall(frame(W["chunk_request"], struct.pack("<qI", 42, 0), request_id=2))
        _, status, _, _ = _C_testing.parse_frame(recv_frame(s))
        assert status == W["reply_unknown_version"]
        s.sendall(frame(W["chunk_request"], struct.pack("<qI", 1, 10**6), request_id=3))
        _, status, _, _ = _C_testing.parse_frame(recv_frame(s))
        assert status == W["reply_not_held"]
        s.sendall(frame(W["chunk_request"], struct.pack("<qI", 1, 0), request_id=4))
        ftype, status, rid, body = _C_testing.parse_frame(recv_frame(s))
        assert (ftype, status, rid) == (W["chunk"], W["reply_ok"], 4)
        assert body[16:] == blob[: len(body) - 16].numpy().tobytes()


def test_wrong_secret_is_refused_both_ways(served):
    pub, blob = served
    with WeightPuller(pub.address, make_config(secret=b"not-the-secret")) as puller:
        with pytest.raises(AuthError):
            puller.pull(1)
    with connect(pub.address) as s:  # a client that cannot prove it knows the secret
        client_handshake(s, SECRET, wrong_proof=True)
        with pytest.raises(AuthError):
            _C_testing.parse_frame(recv_frame(s))
        assert is_closed_by_peer(s)
    assert pub.stats()["auth_failures"] >= 1
    good_pull_works(pub.address, blob)


def test_unknown_version_raises_version_mismatch(served):
    pub, blob = served
    with WeightPuller(pub.address, make_config()) as puller:
        with pytest.raises(VersionMismatch):
            puller.pull(7)
    good_pull_works(pub.address, blob)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_corrupted_chunk_raises_integrity_error(served, transport):
    pub, blob = served
    corrupt_served_byte(pub, 1, 100_000)
    with WeightPuller(pub.address, make_config(transport=transport)) as puller:
        with pytest.raises(IntegrityError):
            puller.pull(1)
    corrupt_served_byte(pub, 1, 100_000)  # flips it back
    good_pull_works(pub.address, blob)


def test_corrupt_source_is_routed_around_when_another_holds_the_chunk(served):
    pub, blob = served
    with WeightPublisher(make_config()) as healthy:
        healthy.publish(1, {"blob": blob})
        corrupt_served_byte(pub, 1, 5)
        with WeightPuller([pub.address, healthy.address], make_config(transport="tcp")) as puller:
            pulled = puller.pull(1)
            assert torch.equal(pulled["blob"], blob)
            failures = {s["address"]: s["integrity_failures"] for s in pulled.stats["sources"]}
            assert failures[healthy.address] == 0
            assert pulled.stats["refetched"] == 0


@pytest.mark.parametrize("behavior, error", [
    ("bad_magic", ProtocolError),
    ("bad_format", ProtocolError),
    ("huge_length", ProtocolError),
    ("truncated", PeerLost),
    ("wrong_chunk_length", ProtocolError),
    ("close_mid_chunk", PeerLost),
])
def test_misbehaving_source_raises_typed_error(behavior, error):
    payload = bytes(range(256)) * 100
    source = HostileSourceForTests(behavior, SECRET, payload)
    try:
        with WeightPuller(source.address, make_config(transport="tcp", reconnect_attempts=0)) as puller:
            with pytest.raises(error):
                puller.pull(1, timeout=30)
    finally:
        source.close()
