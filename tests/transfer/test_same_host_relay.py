"""A relay on the same host as the source (an address a puller was given, run by someone
without the secret) forwards an honest puller's whole connection. Under the default
transfer.encrypt=auto both of its ends are loopback, yet the puller finds that the process
at the other end of its connection is not the source named in the welcome, and logs in
again sealed: the relay sees no byte of the weights."""

from __future__ import annotations

import socket
import threading

import pytest

from rlboost import _C
from rlboost.transfer import WeightPuller

from .helpers import ServerProcess, make_config
from .proxies import shut
from .serve_weights import payload

NBYTES = 1 << 20


class RecordingRelayForTests:
    """Forwards every byte both ways between each accepted connection and `upstream`, and
    keeps a copy of what the source sent."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.seen = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            self._socks += [down, up]
            for src, dst, record in ((down, up, False), (up, down, True)):
                t = threading.Thread(target=self._pump, args=(src, dst, record), daemon=True)
                self._threads.append(t)
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if record:
                    with self._lock:
                        self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        shut(src, dst)

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        shut(*self._socks)
        for t in self._threads:
            t.join(10)
        for s in self._socks:
            s.close()


@pytest.mark.skipif(not _C.HAS_AEAD, reason="built without libcrypto: auto cannot seal (the README says so)")
def test_a_relay_on_the_same_host_sees_no_clear_weights():
    server = ServerProcess(NBYTES)
    relay = RecordingRelayForTests(server.address)
    try:
        with WeightPuller(relay.address, make_config(transport="tcp", relay=False)) as puller:
            pulled = puller.pull(1, timeout=60)
        blob = payload(NBYTES, 0)
        assert bytes(pulled["blob"].numpy()) == bytes(blob.numpy())
        weights = bytes(blob.numpy())
        seen = bytes(relay.seen)
        assert len(seen) > NBYTES  # every chunk went through the relay
        # Any 64 bytes of the weights would show in a clear (MACed) stream.
        for offset in range(0, NBYTES, NBYTES // 16):
            assert weights[offset:offset + 64] not in seen
    finally:
        relay.close()
        server.stop()
