"""Reserved login slots cannot be had without the secret. An attacker relays one honest
puller's login from each of 8 addresses of its own (the four login frames, then it drops
the puller): the logins complete, but no request under their keys ever follows, so the
addresses earn no reserved slots. The attacker's hold flood from those addresses then
waits in the unreserved pool, and an honest puller that logs in anew for every pull (its
address reserved by its own verified requests) loses no login to it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from rlboost.errors import TransferError
from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .adversaries import LegitPullerForTests
from .helpers import make_config
from .proxies import SerialProxyForTests
from .wire_client import recv_frame

ATTACKERS = [f"127.0.0.{i}" for i in range(2, 10)]
HOLD_S, PER_ADDRESS = 8.0, 64
PULLS = 60


class LoginOnlyRelayForTests(SerialProxyForTests):
    """Passes hello, challenge, auth and welcome between a puller and the source over a
    connection of its own from `source_address`, then drops both."""

    def __init__(self, upstream: str, source_address: str):
        super().__init__(upstream)
        self.source_address = source_address
        self._start()

    def _accept_loop(self) -> None:
        host, port = self.upstream.rsplit(":", 1)
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.create_connection((host, int(port)), timeout=10, source_address=(self.source_address, 0))
            self._accepted(down, up)

    def _serve(self, down: socket.socket, up: socket.socket) -> None:
        try:
            for _ in range(2):
                up.sendall(recv_frame(down))
                down.sendall(recv_frame(up))
        except (OSError, ConnectionError):
            pass


@pytest.mark.slow
def test_relayed_logins_earn_the_attackers_addresses_no_reserved_slots():
    blob = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with WeightPublisher(make_config(handshake_timeout_s=2.0, publisher=ServerConfig(max_handshakes=16))) as pub:
        pub.publish(1, {"blob": blob})
        for address in ATTACKERS:  # one honest login relayed from each attacker address
            relay = LoginOnlyRelayForTests(pub.address, address)
            try:
                with WeightPuller(relay.address, make_config(transport="tcp", relay=False, reconnect_attempts=0,
                                                             keep_connections=False)) as victim:
                    with pytest.raises(TransferError):
                        victim.pull(1, timeout=10)
            finally:
                relay.close()
        legit = LegitPullerForTests(pub.address, make_config(relay=False, transport="tcp", keep_connections=False),
                                    {"blob": blob})
        legit.pull_once()  # its address earns its reserved slots the honest way
        holders = [subprocess.Popen([sys.executable, "-m", "tests.transfer.loris", pub.address, str(HOLD_S),
                                     str(2 + i * 4), "4", str(PER_ADDRESS)], stdout=subprocess.PIPE, text=True,
                                    cwd=root) for i in range(2)]
        done, failures = 0, []
        while any(h.poll() is None for h in holders) and done + len(failures) < PULLS:
            try:
                legit.pull_once()
                done += 1
            except Exception as exc:  # counted: the test asserts there are none
                failures.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)
        for h in holders:
            h.wait(timeout=60)
        opened = sum(json.loads(h.communicate()[0])["opened"] for h in holders)
        stats = pub.stats()
        legit.stop()
    print(f"\n[reserved] {opened} held connections from {len(ATTACKERS)} relayed addresses, "
          f"{stats['handshakes_dropped']} logins dropped; honest pulls: {done} ok, {len(failures)} failed")
    assert done > 0 and not failures, failures[:5]
