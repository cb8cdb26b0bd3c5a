"""Relay: a process that holds a version (or part of it) serves it to others, so
newcomers do not all drain the trainer's link."""

import gc
import socket
import struct
import threading
import weakref

import pytest
import torch

from rlboost import _C, _C_testing
from rlboost.errors import TransferError
from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import BUILT_TRANSPORTS, SECRET, assert_same, make_config, random_tensors, wait_for_bytes, wait_until
from .proxies import PumpingProxyForTests, shut
from .wire_client import HEADER, W, client_handshake, connect, frame, is_closed_by_peer, recv_frame


@pytest.mark.parametrize("transport", BUILT_TRANSPORTS)
def test_peer_relays_a_version_it_pulled(publisher, transport):
    tensors = random_tensors(2)
    publisher.publish(1, tensors)
    cfg = make_config(transport=transport)
    with WeightPuller(publisher.address, cfg) as first, WeightPuller(first.relay_address, cfg) as second:
        first.pull(1)
        if transport == "tcp":  # (shared memory sends no payload bytes through the socket)
            # the server counts what it sent once its send returns, which may be just after the
            # puller has the bytes: wait for the whole version before taking the figure
            payload = sum(t.numel() * t.element_size() for t in tensors.values())
            assert wait_until(lambda: publisher.stats()["bytes_sent"] >= payload)
        sent = publisher.stats()["bytes_sent"]
        pulled = second.pull(1)
        assert_same(pulled, tensors)
        assert publisher.stats()["bytes_sent"] == sent  # nothing more from the trainer
        assert [s["address"] for s in pulled.stats["sources"]] == [first.relay_address]


def test_newcomer_pulls_from_a_peer_that_is_still_pulling():
    blob = torch.randint(0, 256, (2 << 20,), dtype=torch.uint8)
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=1_000_000))) as pub:
        pub.publish(1, {"blob": blob})
        cfg = make_config(transport="tcp")
        with WeightPuller(pub.address, cfg) as first, WeightPuller(first.relay_address, cfg) as second:
            h1 = first.prepare(1).start()
            wait_for_bytes(h1, 256 << 10)
            h2 = second.prepare(1).start()  # the peer holds only part of the version
            assert h2.bytes_done < blob.numel()
            p2, p1 = h2.wait(timeout=60), h1.wait(timeout=60)
            assert torch.equal(p1["blob"], blob) and torch.equal(p2["blob"], blob)
            # a server counts what it sent once its send returns, which may be just after the
            # puller has the bytes: wait for the whole version before taking the figures
            assert wait_until(lambda: pub.stats()["bytes_sent"] >= blob.numel())
            assert wait_until(lambda: first.stats()["bytes_sent"] >= blob.numel())
            assert pub.stats()["bytes_sent"] == blob.numel()  # only the first puller used the trainer
            assert first.stats()["bytes_sent"] == blob.numel()


def test_relay_answers_not_held_for_chunks_it_lacks():
    store = _C.VersionStore(versions_kept=2, secret=SECRET)
    server = _C.WeightServer(store=store, host="127.0.0.1", port=0, secret=SECRET)
    try:
        region = _C.Region.create(3 * 4096)
        store.add_partial(_C.Manifest(version=5, total_bytes=3 * 4096, chunk_bytes=4096, tags=bytes(48), meta=b""), region)
        with connect(f"127.0.0.1:{server.port}") as s:
            s = client_handshake(s, SECRET)
            s.sendall(frame(W["chunk_request"], struct.pack("<qI", 5, 1), request_id=1))
            ftype, status, _, body = _C_testing.parse_frame(recv_frame(s))
            assert (ftype, status, len(body)) == (W["chunk"], W["reply_not_held"], 16)
            s.sendall(frame(W["have_request"], struct.pack("<qQI", 5, 0, 0), request_id=2))
            _, _, _, have = _C_testing.parse_frame(recv_frame(s))
            version, chunks, held, _generation = struct.unpack("<qIIQ", have[:24])
            assert (version, chunks, held) == (5, 3, 0) and have[24:] == b"\x00\x00"
    finally:
        server.close()


class GatedTrainerLinkForTests(PumpingProxyForTests):
    """The trainer's link: forwards both ways, except that what the trainer sends waits
    while `open` is clear."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.open = threading.Event()
        self.open.set()
        self._start()

    def _pump(self, src, dst, from_server: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if from_server:
                    assert self.open.wait(60)
                dst.sendall(data)
        except (ConnectionError, OSError):
            pass
        shut(src, dst)


def test_four_newcomers_share_the_trainer_link_through_relays():
    nbytes = 4 << 20
    blob = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    # The trainer's egress is capped; the relays' is not (roles have limits of their own).
    cfg = make_config(transport="tcp", publisher=ServerConfig(egress_bytes_per_s=4_000_000))
    with WeightPublisher(cfg) as pub:
        pub.publish(1, {"blob": blob})
        link = GatedTrainerLinkForTests(pub.address)
        pullers = [WeightPuller(link.address, cfg) for _ in range(4)]
        try:
            for i, p in enumerate(pullers):
                p.set_sources([link.address] + [q.relay_address for q in pullers if q is not p])
            prepared = [p.prepare(1) for p in pullers]
            # the four pulls run at once, as newcomers that join together do: the trainer's
            # bytes wait until every one has started (on busy cores the first could
            # otherwise finish before the last starts, and each later one draw a share of the
            # trainer's link besides its peers')
            link.open.clear()
            handles = [h.start() for h in prepared]
            link.open.set()
            for h in handles:
                assert torch.equal(h.wait(timeout=120)["blob"], blob)
            # Without relays the trainer would send the payload four times.
            assert pub.stats()["bytes_sent"] < 2 * nbytes
            assert sum(p.stats()["bytes_sent"] for p in pullers) > nbytes
        finally:
            for p in pullers:
                p.close()
            link.close()


def test_a_version_without_chunks_relays_and_reports_an_empty_bitmap(publisher):
    publisher.publish(1, {"empty": torch.empty(0)})
    cfg = make_config()
    with WeightPuller(publisher.address, cfg) as first, \
            WeightPuller([publisher.address, first.relay_address], cfg) as second:
        assert first.pull(1)["empty"].numel() == 0
        assert second.pull(1)["empty"].numel() == 0  # both sources' held bitmaps are empty


def test_a_relay_port_already_taken_says_so_and_how_to_avoid_it(publisher):
    cfg = make_config()
    with WeightPuller(publisher.address, cfg) as first:
        port = int(first.relay_address.rsplit(":", 1)[1])
        with pytest.raises(TransferError, match=rf"{port}.*port 0 picks a free one"):
            WeightPuller(publisher.address, make_config(relay_server=ServerConfig(port=port)))


def test_a_peer_that_never_reads_its_chunk_does_not_keep_the_relay_from_its_next_version():
    big = torch.randn(8 << 20)  # 32 MiB: far more than a socket buffer holds
    cfg = make_config(request_timeout_s=2.0, chunk_bytes=16 << 20)
    with WeightPublisher(cfg) as pub:
        pub.publish(1, {"w": big})
        pub.publish(2, {"w": big + 1})
        with WeightPuller(pub.address, cfg) as relay:
            v1 = relay.pull(1)
            reader = connect(relay.relay_address)
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader = client_handshake(reader, SECRET)
            reader.sendall(frame(W["chunk_request"], struct.pack("<qI", 1, 0), request_id=1))  # never read
            try:
                # Pulling into v1's memory itself (no second buffer: a caller's tensor) retires
                # version 1, which waits for the stuck send to end: the server gives up on
                # it (send_timeout_s) before the retire does.
                assert torch.equal(relay.pull(2, into=v1.buffer)["w"], big + 1)
            finally:
                reader.close()


def stuck_reader(address: str, version: int) -> socket.socket:
    """A peer that asks for chunk 0 of `version` and never reads the reply."""
    reader = connect(address)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader = client_handshake(reader, SECRET)
    reader.sendall(frame(W["chunk_request"], struct.pack("<qI", version, 0), request_id=1))
    return reader


def test_a_relay_pulls_its_next_version_into_a_second_buffer_while_a_peer_reads_the_first():
    big = torch.randn(8 << 20)  # 32 MiB: far more than a socket buffer holds
    # A stuck send outlives the relay's retire deadline: waiting for it would fail the pull.
    cfg = make_config(request_timeout_s=5.0, send_timeout_s=600.0, chunk_bytes=16 << 20, transport="tcp")
    with WeightPublisher(cfg) as pub:
        pub.publish(1, {"w": big})
        pub.publish(2, {"w": big + 1})
        with WeightPuller(pub.address, cfg) as relay:
            v1 = relay.pull(1)
            first = weakref.ref(v1.region)
            reader = stuck_reader(relay.relay_address, 1)
            try:
                assert wait_until(lambda: relay.stats()["reads_in_flight"].get(1, 0) > 0)
                v2 = relay.pull(2, into=v1, timeout=120)
                assert torch.equal(v2["w"], big + 1)
                assert v2.buffer.data_ptr() != v1.buffer.data_ptr()
                assert relay.stats()["retiring_versions"] == [1]
                with WeightPuller(relay.relay_address, make_config(relay=False, transport="tcp")) as peer:
                    assert torch.equal(peer.pull(1, timeout=120)["w"], big)  # still served, intact
            finally:
                reader.close()
            # Once the stuck read ends, version 1 is retired and its buffer released.
            assert wait_until(lambda: relay.stats()["retiring_versions"] == [])
            assert relay.relayed_versions == [2]
            del v1
            gc.collect()
            assert first() is None


def test_a_relay_whose_both_buffers_are_read_waits_for_the_readers_of_the_one_it_reuses():
    big = torch.randn(8 << 20)
    cfg = make_config(request_timeout_s=2.0, send_timeout_s=600.0, chunk_bytes=16 << 20, transport="tcp",
                      publisher=ServerConfig(versions_kept=3), relay_server=ServerConfig(versions_kept=3))
    with WeightPublisher(cfg) as pub:
        for v in (1, 2, 3):
            pub.publish(v, {"w": big + v})
        with WeightPuller(pub.address, cfg) as relay:
            v1 = relay.pull(1)
            readers = [stuck_reader(relay.relay_address, 1)]
            try:
                assert wait_until(lambda: relay.stats()["reads_in_flight"].get(1, 0) > 0)
                v2 = relay.pull(2, into=v1)
                readers.append(stuck_reader(relay.relay_address, 2))
                assert wait_until(lambda: relay.stats()["reads_in_flight"].get(2, 0) > 0)
                # No third buffer: reusing v2's waits for its reader, which outlasts the wait.
                with pytest.raises(TransferError):
                    relay.pull(3, into=v2)
                assert relay.relayed_versions == [1, 2]
            finally:
                for r in readers:
                    r.close()
            assert torch.equal(relay.pull(3, into=v2)["w"], big + 3)


def test_a_peer_that_takes_a_shared_memory_lease_and_goes_quiet_loses_it():
    cfg = make_config(request_timeout_s=5.0, send_timeout_s=0.5, transport="tcp")
    with WeightPublisher(cfg) as pub:
        pub.publish(1, random_tensors(1))
        with WeightPuller(pub.address, cfg) as relay:
            relay.pull(1)
            peer = connect(relay.relay_address, timeout=60)
            try:
                peer = client_handshake(peer, SECRET)
                peer.sendall(frame(W["shm_open_request"], struct.pack("<q", 1), request_id=1))
                assert HEADER.unpack(recv_frame(peer)[: W["header_bytes"]])[3] == W["reply_ok"]
                assert relay.stats()["reads_in_flight"] == {1: 1}  # the lease pins version 1
                # No request follows: the relay closes the connection, ending the lease.
                assert is_closed_by_peer(peer)
            finally:
                peer.close()
            assert relay.stats()["leases_expired"] == 1
            relay.retire(1)  # nothing holds it any more: no wait for a reader
            assert relay.stats()["reads_in_flight"] == {}
