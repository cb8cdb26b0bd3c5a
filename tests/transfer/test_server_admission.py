"""Who a weight server lets in: sockets that never authenticate have slots and a deadline
of their own, so they can neither fill a server nor keep real pullers out. The squatters
here send the first byte of a frame and stall: a socket that sends nothing at all is not
even handed to the server until its first byte comes (the listener defers accepting it;
tests/transfer/test_slow_loris.py)."""

import socket

import pytest

from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import assert_same, make_config, random_tensors
from .wire_client import W, frame, is_closed_by_peer

SHORT = 5.0


def _stalled_sockets(address: str, n: int) -> list[socket.socket]:
    """n connections that each send one byte of a login frame's header and then nothing."""
    host, port = address.rsplit(":", 1)
    out = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(frame(W["hello"])[:1])
        out.append(s)
    return out


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_stalled_unauthenticated_sockets_do_not_count_toward_max_connections(transport):
    tensors = random_tensors(11)
    with WeightPublisher(make_config(publisher=ServerConfig(max_connections=4))) as pub:
        pub.publish(1, tensors)
        squatters = _stalled_sockets(pub.address, 8)  # accepted before the puller's, one byte each
        try:
            with WeightPuller(pub.address, make_config(transport=transport, relay=False)) as puller:
                assert_same(puller.pull(1, timeout=SHORT), tensors)
            assert pub.stats()["connections_refused"] == 0
        finally:
            for s in squatters:
                s.close()


def test_when_handshake_slots_are_full_the_oldest_unauthenticated_socket_is_dropped():
    tensors = random_tensors(12)
    with WeightPublisher(make_config(publisher=ServerConfig(max_handshakes=16), handshake_timeout_s=60)) as pub:
        pub.publish(1, tensors)
        squatters = _stalled_sockets(pub.address, 40)  # one host may hold 4 slots
        try:
            with WeightPuller(pub.address, make_config(transport="tcp", relay=False)) as puller:
                assert_same(puller.pull(1, timeout=SHORT), tensors)
            squatters[0].settimeout(SHORT)
            assert is_closed_by_peer(squatters[0])  # the oldest was closed to make room (EOF or reset)
            assert pub.stats()["handshakes_dropped"] >= 36
        finally:
            for s in squatters:
                s.close()


def test_a_socket_that_does_not_authenticate_in_time_is_closed():
    with WeightPublisher(make_config(handshake_timeout_s=0.2)) as pub:
        (silent,) = _stalled_sockets(pub.address, 1)
        with silent:
            silent.settimeout(SHORT)  # far beyond the handshake deadline
            assert is_closed_by_peer(silent)


def test_a_connection_idle_for_a_moment_between_requests_outlives_a_younger_stall():
    """An honest puller is idle for milliseconds between its requests; a newcomer over the cap
    must close a peer's fresh stall mid-frame rather than that connection (under a swarm of
    such stalls on a loaded host, honest pulls were cut mid-pull)."""
    from .helpers import SECRET
    from .wire_client import W, client_handshake, connect, frame, is_closed_by_peer

    with WeightPublisher(make_config(publisher=ServerConfig(max_connections=2))) as pub:
        pub.publish(1, random_tensors(13))
        stall = client_handshake(connect(pub.address), SECRET)
        stall.sock.sendall(frame(W["manifest_request"], bytes(8), request_id=1)[:10])  # a partial frame, then silence
        honest = client_handshake(connect(pub.address), SECRET)
        honest.sendall(frame(W["manifest_request"], (1).to_bytes(8, "little"), request_id=1))
        honest.recv_frame()  # answered: now idle, younger in its state than the stall
        newcomer = client_handshake(connect(pub.address), SECRET)
        try:
            stall.settimeout(SHORT)
            assert is_closed_by_peer(stall.sock)  # the stall went for the newcomer
            honest.sendall(frame(W["manifest_request"], (1).to_bytes(8, "little"), request_id=2))
            honest.settimeout(SHORT)
            assert honest.recv_frame()  # and the idle one still serves
            assert pub.stats()["connections_evicted"] + pub.stats()["stalled_evicted"] == 1
        finally:
            for s in (stall, honest, newcomer):
                s.close()
