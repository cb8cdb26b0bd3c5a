"""UCX serving over loopback: endpoints close when their puller goes, one control
connection cannot pile up registrations, and a read from a source that stopped
responding ends with PeerLost instead of spinning forever."""

from __future__ import annotations

import os
import signal
import struct
import threading

import pytest
import torch

from rlboost import _C, _C_testing
from rlboost.errors import PeerLost, ProtocolError
from rlboost.transfer import WeightPuller

from .helpers import BUILT_TRANSPORTS, make_config, wait_for_bytes, wait_until
from .wire_client import W, client_handshake, connect, frame, is_closed_by_peer, recv_frame

pytestmark = pytest.mark.skipif("ucx" not in BUILT_TRANSPORTS, reason="UCX transport not built")

UCX_OPEN_REQUEST, UCX_OPEN = 15, 16  # frame types (csrc/common/frame.h)
MAX_REGISTRATIONS_PER_CONNECTION = 4


@pytest.fixture(autouse=True)
def loopback_ucx(monkeypatch):
    # Read by UCX whenever a context is created: keep every UCX byte on loopback.
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")


def test_server_endpoints_close_when_each_pull_ends(publisher):
    blob = torch.randint(0, 256, (16 << 20,), dtype=torch.uint8)
    publisher.publish(1, {"blob": blob})
    most_open, stop = [0], threading.Event()

    def sample() -> None:  # endpoints exist only while a pull reads
        while not stop.is_set():
            most_open[0] = max(most_open[0], _C.ucx_service_stats()["endpoints"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for _ in range(5):
            with WeightPuller(publisher.address, make_config(transport="ucx")) as puller:
                assert torch.equal(puller.pull(1, timeout=60)["blob"], blob)
            assert wait_until(lambda: _C.ucx_service_stats()["endpoints"] == 0), _C.ucx_service_stats()
    finally:
        stop.set()
        sampler.join()
    assert most_open[0] >= 1


def _ucx_open(sock, request_id: int) -> None:
    sock.sendall(frame(UCX_OPEN_REQUEST, struct.pack("<q", 1), request_id=request_id))


def test_registrations_per_connection_are_capped(publisher, config):
    publisher.publish(1, {"blob": torch.zeros(1 << 16, dtype=torch.uint8)})
    sock = connect(publisher.address)
    sock = client_handshake(sock, config.secret)
    for rid in range(1, MAX_REGISTRATIONS_PER_CONNECTION + 1):
        _ucx_open(sock, rid)
        ftype, status, got_rid, _ = _C_testing.parse_frame(recv_frame(sock))
        assert (ftype, status, got_rid) == (UCX_OPEN, W["reply_ok"], rid)
    _ucx_open(sock, 99)
    with pytest.raises(ProtocolError, match="UCX registrations"):
        _C_testing.parse_frame(recv_frame(sock))
    assert is_closed_by_peer(sock)
    sock.close()
    with WeightPuller(publisher.address, make_config(transport="ucx")) as puller:  # others still served
        assert puller.pull(1, timeout=60)["blob"].numel() == 1 << 16


def test_read_from_a_frozen_source_ends_with_peer_lost(server_processes, monkeypatch):
    # Over TCP a UCX get cannot be cancelled; a stopped source used to leave the lane
    # progressing forever after its deadline (and the puller hung on close).
    monkeypatch.setenv("UCX_TLS", "tcp")  # cma would read a stopped process's memory anyway
    server = server_processes(256 << 20, chunk=1 << 20)
    config = make_config(transport="ucx", request_timeout_s=2.0, connect_timeout_s=2.0,
                         reconnect_attempts=0, streams=1)
    try:
        with WeightPuller(server.address, config) as puller:
            handle = puller.prepare(1).start()
            wait_for_bytes(handle, 4 << 20)
            os.kill(server.proc.pid, signal.SIGSTOP)
            with pytest.raises(PeerLost):
                handle.wait(timeout=120)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
