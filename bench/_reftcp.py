"""The published reference's TCP weight engine, rebuilt from its description as a peer.

What it does (reference-implementation.md §3.4, the PolyRL repository's
rlboost/weight_transfer/transfer_engine.py): the sender PUSHES. For one transfer it splits
the buffer into K contiguous chunks (floor(L/K), the remainder to the last), opens a NEW
TCP connection per chunk to the receiver's K listening ports (SO_SNDBUF/SO_RCVBUF 16 MiB,
TCP_NODELAY), writes a 16-byte header (offset u64 LE, length u64 LE) and then the chunk
with `os.sendfile` from the file that holds the weights. Each receiver listener reads the
header, checks its bounds and `recv_into`s the buffer in slices of at most 64 MiB. There
is no authentication, integrity check or encryption. K is `num_mooncake_engines_per_group`
(8 in the reference's config.toml, 1 without one). This is an independent rebuild for
measurement, not the reference's code.
"""

from __future__ import annotations

import os
import socket
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from _common import Child, MiB, wait_command

_HEADER = struct.Struct("<QQ")
_SOCK_BUF = 16 * MiB
_RECV_SLICE = 64 * MiB


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCK_BUF)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCK_BUF)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _chunks(total: int, streams: int) -> list[tuple[int, int]]:
    size = total // streams
    return [(i * size, size if i < streams - 1 else total - i * size) for i in range(streams)]


def _push_one(fd: int, port: int, offset: int, length: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        _tune(sock)
        sock.connect(("127.0.0.1", port))
        sock.sendall(_HEADER.pack(offset, length))
        sent = 0
        while sent < length:
            n = os.sendfile(sock.fileno(), fd, offset + sent, length - sent)
            if n == 0:
                raise ConnectionError("receiver closed early")
            sent += n


def serve_reftcp(conn, path: str, streams: int) -> None:
    """Child: the sender agent. On ("push", (n, ports)) it pushes n bytes over the ports."""
    fd = os.open(path, os.O_RDONLY)
    with ThreadPoolExecutor(streams) as pool:
        conn.send(("ready", None))
        while True:
            kind, payload = wait_command(conn)
            if kind != "push":
                break
            n, ports = payload
            jobs = [pool.submit(_push_one, fd, port, off, length)
                    for port, (off, length) in zip(ports, _chunks(n, streams))]
            for job in jobs:
                job.result()
            conn.send(("pushed", None))
    os.close(fd)


def _receive_one(server: socket.socket, view: memoryview) -> None:
    sock, _ = server.accept()
    with sock:
        _tune(sock)
        head = bytearray(_HEADER.size)
        _recv_exact(sock, memoryview(head))
        offset, length = _HEADER.unpack(head)
        if offset + length > len(view):
            raise ValueError(f"chunk {offset}+{length} past the {len(view)}-byte buffer")
        _recv_exact(sock, view[offset:offset + length])


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:got + _RECV_SLICE])
        if n == 0:
            raise ConnectionError("sender closed early")
        got += n


class RefTcpSession:
    """The reference's push engine: K new connections per transfer, header, sendfile."""

    key = "ref_tcp"

    def __init__(self, dst: np.ndarray, path: str, streams: int = 8):
        self.peer = f"reference TCP engine ({streams} streams)"
        self.note = "push, new connections per transfer, sendfile, 16 MiB socket buffers"
        self.view, self.streams = memoryview(dst), streams
        self.servers = []
        for _ in range(streams):
            server = socket.create_server(("127.0.0.1", 0), backlog=256)
            _tune(server)
            self.servers.append(server)
        self.pool = ThreadPoolExecutor(streams)
        self.child = Child(serve_reftcp, path, streams)
        self.sender_pids = (self.child.proc.pid,)
        try:
            self.child.expect("ready")
        except BaseException:
            self.close()
            raise

    def prepare(self, nbytes: int) -> None:
        pass

    def once(self, n: int) -> None:
        view = self.view[:n]
        jobs = [self.pool.submit(_receive_one, s, view) for s in self.servers]
        self.child.send("push", (n, [s.getsockname()[1] for s in self.servers]))
        for job in jobs:
            job.result()
        self.child.expect("pushed")

    def close(self) -> None:
        if self.child.proc.is_alive():
            self.child.send("stop")
        self.child.close(timeout=5.0)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for server in self.servers:
            server.close()
