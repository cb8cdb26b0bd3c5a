"""Everything after a login belongs to that login (wire format 4): an attacker without the
secret who relays an honest puller's four login frames to a real source, then drops the
puller and speaks on the authenticated connection, gets AuthError for every request it
makes, replayed or made up; and the welcome's identity cannot be altered on the way."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from rlboost import _C_testing
from rlboost.errors import AuthError, TransferError
from rlboost.transfer import WeightPuller

from .helpers import make_config
from .proxies import SerialProxyForTests
from .wire_client import HEADER, MODE_MAC, W, frame, recv_exact, recv_frame

REQUESTS = {
    "manifest": frame(W["manifest_request"], struct.pack("<q", 1), request_id=1),
    "chunk": frame(W["chunk_request"], struct.pack("<qI", 1, 0), request_id=1),
    "have": frame(W["have_request"], struct.pack("<qQI", 1, 0, 0), request_id=1),
    "shm-open": frame(W["shm_open_request"], struct.pack("<q", 1), request_id=1),
}


class LoginRelayForTests(SerialProxyForTests):
    """Sits where a puller dialled (a fake relay address, or anywhere on the path): passes
    hello, challenge, auth and welcome between the puller and the real source, then (after
    the puller's first request and its reply, when `replay`) drops the puller and sends
    `request` on the source's connection, with a made-up tag or as a replay of the
    puller's first request. `answers` holds what the source said to each attempt."""

    def __init__(self, upstream: str, request: bytes | None):
        super().__init__(upstream)
        self.request, self.answers, self.modes = request, [], []
        self._start()

    def _serve(self, down: socket.socket, up: socket.socket) -> None:
        try:
            self.answers.append(self._relay(down, up))
        except (OSError, ConnectionError) as exc:
            self.answers.append(exc)

    def _relay(self, down: socket.socket, up: socket.socket) -> object:
        for _ in range(2):  # hello -> challenge, auth -> welcome
            up.sendall(recv_frame(down))
            answer = recv_frame(up)
            down.sendall(answer)
        self.modes.append(struct.unpack("<I", answer[-36:-32])[0])  # the welcome's mode, before its proof
        if self.request is None:  # a replay: the puller's first request, once it was answered
            first = recv_frame(down) + recv_exact(down, 16)
            up.sendall(first)
            recv_frame(up)
            recv_exact(up, 16)
            attack = first
        else:
            attack = self.request + os.urandom(16)  # the relay cannot compute the tag
        down.shutdown(socket.SHUT_RDWR)  # the puller is dropped
        up.sendall(attack)
        try:
            return _C_testing.parse_frame(recv_frame(up))  # what the source answers the relay
        except TransferError as exc:
            return exc


@pytest.mark.parametrize("request_kind", [*REQUESTS, "replayed"])
def test_a_relayed_login_gives_the_relay_nothing_but_auth_errors(served, request_kind):
    pub, blob = served
    relay = LoginRelayForTests(pub.address, REQUESTS.get(request_kind))
    try:
        with WeightPuller(relay.address, make_config(transport="tcp", relay=False, reconnect_attempts=0,
                                                     keep_connections=False)) as victim:
            with pytest.raises(TransferError):
                victim.pull(1, timeout=20)
    finally:
        relay.close()
    assert relay.answers, "the puller never reached the relay"
    # A puller that finds the relay in front of a source on its own host logs in again,
    # sealed: the relay then cannot even read the source's refusal.
    for answer, mode in zip(relay.answers, relay.modes):
        assert isinstance(answer, AuthError if mode == MODE_MAC else TransferError), answer
    assert pub.stats()["auth_failures"] >= len(relay.answers)
    # The source still serves its honest pullers.
    with WeightPuller(pub.address, make_config(transport="tcp", relay=False)) as honest:
        assert bytes(honest.pull(1)["blob"].numpy()) == bytes(blob.numpy())


class WelcomeRewritingProxyForTests(SerialProxyForTests):
    """On the path: forwards every frame, but rewrites the pid in the source's welcome (a
    relay that would make a remote source look like a same-host one)."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self._start()

    def _serve(self, down: socket.socket, up: socket.socket) -> None:
        try:
            up.sendall(recv_frame(down))
            down.sendall(recv_frame(up))
            up.sendall(recv_frame(down))
            welcome = bytearray(recv_frame(up))
            _, _, ftype, _, _, _ = HEADER.unpack(welcome[:24])
            if ftype == W["welcome"]:
                welcome[24 + 24] ^= 0x01  # the pid's low byte
            down.sendall(bytes(welcome))
            down.recv(1)
        except (OSError, ConnectionError):
            pass


def test_an_altered_welcome_identity_is_refused(served):
    pub, _ = served
    proxy = WelcomeRewritingProxyForTests(pub.address)
    try:
        with WeightPuller(proxy.address, make_config(transport="tcp", relay=False, reconnect_attempts=0)) as p:
            with pytest.raises(AuthError, match="shared secret"):
                p.pull(1, timeout=20)
    finally:
        proxy.close()
