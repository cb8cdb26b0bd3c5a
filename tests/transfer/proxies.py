"""On-path attackers' plumbing for the adversarial tests: a listener on 127.0.0.1 in front
of a real source. PumpingProxyForTests opens an upstream connection for each accepted one
and runs `_pump` both ways on threads; SerialProxyForTests serves one connection at a time
with `_serve`. close() shuts every socket, joins every thread, then closes the sockets, so
none outlives a test."""

from __future__ import annotations

import socket
import struct
import threading

from .wire_client import HEADER, connect, recv_sealed


def shut(*socks: socket.socket) -> None:
    """Shut down both ways, which wakes a thread blocked in recv or send on them. Not closed
    here: a close while another thread is in recv on the same descriptor races with that
    call (ThreadSanitizer reports it, and the number can be reused at once); a proxy closes
    its sockets once its threads are joined."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Listening:
    def __init__(self, upstream: str):
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True)]

    def _start(self) -> None:
        self._threads[0].start()

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone would not
        self._listener.close()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=10)
        for s in self._socks:
            s.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            self._accepted(down, connect(self.upstream))

    def _accepted(self, down: socket.socket, up: socket.socket) -> None:
        raise NotImplementedError


class PumpingProxyForTests(_Listening):
    """Subclasses define `_pump(src, dst, from_server)`, run for each direction of each
    connection (from_server: src is the source's side), and call `_start()` last in their
    __init__."""

    def _accepted(self, down: socket.socket, up: socket.socket) -> None:
        self._socks += [down, up]
        for args in ((down, up, False), (up, down, True)):
            t = threading.Thread(target=self._pump, args=args, daemon=True)
            self._threads.append(t)
            t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        raise NotImplementedError


class SerialProxyForTests(_Listening):
    """Subclasses define `_serve(down, up)`, run on the accepting thread for one connection
    at a time (its sockets are closed after it), and call `_start()` last in __init__."""

    def _accepted(self, down: socket.socket, up: socket.socket) -> None:
        with down, up:  # not in _socks: close() lets the exchange under way finish
            self._serve(down, up)

    def _serve(self, down: socket.socket, up: socket.socket) -> None:
        raise NotImplementedError


class TaggedProxyForTests(PumpingProxyForTests):
    """An on-path attacker without the secret: forwards every frame (the two login frames of
    each direction bare, every later one with its tag), passing the source's through
    `rewrite(ftype, body)`; counts the frames it changed."""

    def __init__(self, upstream: str, rewrite):
        super().__init__(upstream)
        self.rewrite, self.rewritten = rewrite, 0
        self._start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        frames = 0
        try:
            while True:
                head, body, tag = recv_sealed(src, frames >= 2)
                frames += 1
                if from_server:
                    new = self.rewrite(HEADER.unpack(head)[2], body)
                    if new != body:
                        self.rewritten += 1
                        head = head[:12] + struct.pack("<I", len(new)) + head[16:]
                        body = new
                dst.sendall(head + body + tag)
        except (ConnectionError, OSError):
            shut(src, dst)
