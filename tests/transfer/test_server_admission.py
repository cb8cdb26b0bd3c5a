"""Who a weight server lets in: sockets that never authenticate have slots and a deadline
of their own, so they can neither fill a server nor keep real pullers out."""

import socket

import pytest

from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import assert_same, make_config, random_tensors

SHORT = 5.0


def _silent_sockets(address: str, n: int) -> list[socket.socket]:
    host, port = address.rsplit(":", 1)
    return [socket.create_connection((host, int(port))) for _ in range(n)]


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_silent_unauthenticated_sockets_do_not_count_toward_max_connections(transport):
    tensors = random_tensors(11)
    with WeightPublisher(make_config(publisher=ServerConfig(max_connections=4))) as pub:
        pub.publish(1, tensors)
        squatters = _silent_sockets(pub.address, 8)  # accepted before the puller's, never a byte
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
        squatters = _silent_sockets(pub.address, 40)  # one host may hold 4 slots
        try:
            with WeightPuller(pub.address, make_config(transport="tcp", relay=False)) as puller:
                assert_same(puller.pull(1, timeout=SHORT), tensors)
            squatters[0].settimeout(SHORT)
            assert squatters[0].recv(1) == b""  # the oldest was closed to make room
            assert pub.stats()["handshakes_dropped"] >= 36
        finally:
            for s in squatters:
                s.close()


def test_a_socket_that_does_not_authenticate_in_time_is_closed():
    with WeightPublisher(make_config(handshake_timeout_s=0.2)) as pub:
        (silent,) = _silent_sockets(pub.address, 1)
        with silent:
            silent.settimeout(SHORT)  # far beyond the handshake deadline
            assert silent.recv(1) == b""
