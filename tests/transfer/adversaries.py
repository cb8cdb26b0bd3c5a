"""Attackers for the adversarial transfer tests, written from the wire format (wire_client):
an on-path proxy that forges every chunk while keeping its CRC-32C, a swarm of peers that
stall or trickle before or after login (and reconnect when closed), a peer that hoards
shared-memory leases, and a legitimate puller that pulls throughout and checks every byte.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import torch

from rlboost import _C, _C_testing
from rlboost.transfer import WeightPuller

from .proxies import PumpingProxyForTests, shut
from .wire_client import HEADER, W, client_handshake, connect, frame, recv_frame, recv_sealed

# --------------------------------------------------------------------------- CRC forging
_POLY = 0x82F63B78  # CRC-32C, reflected


def _table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        out.append(c)
    return out


_T = _table()
_BY_TOP = {t >> 24: i for i, t in enumerate(_T)}  # the top bytes of a CRC table are distinct


def forge_crc32c(data: bytearray, target: int) -> None:
    """Rewrites data's last 4 bytes so that crc32c(data) == target. Four bytes from register
    s with little-endian word w leave G^4(s ^ w), G(x) = (x >> 8) ^ T[x & 0xFF], and G is
    inverted one byte at a time from the top byte of its table entry."""
    before = _C.crc32c(bytes(data[:-4])) ^ 0xFFFFFFFF
    reg = target ^ 0xFFFFFFFF
    for _ in range(4):
        i = _BY_TOP[reg >> 24]
        reg = (((reg ^ _T[i]) << 8) | i) & 0xFFFFFFFF
    data[-4:] = (reg ^ before).to_bytes(4, "little")


class ChunkForgingProxyForTests(PumpingProxyForTests):
    """An on-path attacker without the secret between pullers and a real source: forwards
    the handshake and manifests untouched and replaces the bytes of every chunk it carries
    with others of the same CRC-32C (so any CRC check would pass)."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.forged = 0
        self._start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        frames = 0
        try:
            while True:
                head, body, tag = recv_sealed(src, frames >= 2)  # login frames carry no tag
                frames += 1
                _, _, ftype, status, length, _ = HEADER.unpack(head)
                if from_server and ftype == W["chunk"] and status == W["reply_ok"] and length > 20:
                    body = body[:16] + self._forge(body[16:])  # the frame's tag covers only the prefix
                dst.sendall(head + body + tag)
        except (ConnectionError, OSError):
            shut(src, dst)

    def _forge(self, chunk: bytes) -> bytes:
        forged = bytearray(b ^ 0x5A for b in chunk)
        forge_crc32c(forged, _C.crc32c(chunk))
        assert _C.crc32c(bytes(forged)) == _C.crc32c(chunk) and bytes(forged) != chunk
        self.forged += 1
        return bytes(forged)


# --------------------------------------------------------------------------- slow peers
@dataclass
class PeerConnection:
    """One attacker connection: when it opened, when its deadline started, when it closed."""

    kind: str  # "stall-login", "trickle-login", "stall-frame", "trickle-frame"
    sock: socket.socket
    opened: float
    clock_from: float  # the server's deadline for it counts from here
    closed: float | None = None
    sent: int = 0


@dataclass
class SlowPeerSwarm:
    """Peers that stall or trickle (one byte every `trickle_s`) before login (unauthenticated)
    or inside a request frame after login (authenticated with `secret`). Each one closed by
    the server is replaced on the next tick, so the pressure lasts until stop() (stalled
    peers that come back, not a flood of new connections)."""

    address: str
    secret: bytes
    counts: dict[str, int]  # kind -> how many at once
    trickle_s: float = 0.1
    connections: list[PeerConnection] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._retry: list[str] = []  # kinds whose connection could not open: tried again each tick
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "SlowPeerSwarm":
        for kind, n in self.counts.items():
            for _ in range(n):
                self._open(kind)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for c in self.connections:
            if c.closed is None:
                c.sock.close()

    def open_now(self) -> int:
        return sum(1 for c in self.connections if c.closed is None)

    def _open(self, kind: str) -> None:
        try:
            s = connect(self.address, timeout=5)
            if kind.endswith("frame"):
                client_handshake(s, self.secret)
        except (OSError, ConnectionError, AssertionError) as exc:  # refused, evicted at once
            self.failures.append(f"{kind}: {exc}")
            self._retry.append(kind)
            return
        s.setblocking(False)
        now = time.monotonic()
        c = PeerConnection(kind, s, opened=now, clock_from=now)
        self.connections.append(c)
        self._sel.register(s, selectors.EVENT_READ, c)
        if kind.startswith("stall"):
            self._send(c, self._payload(c)[:10])  # a partial frame, then silence

    def _payload(self, c: PeerConnection) -> bytes:
        if c.kind.endswith("login"):
            return frame(W["hello"], bytes(40))
        return frame(W["manifest_request"], struct.pack("<q", 1), request_id=1)

    def _send(self, c: PeerConnection, data: bytes) -> None:
        try:
            c.sock.send(data)
            if c.sent == 0 and c.kind.endswith("frame"):
                c.clock_from = time.monotonic()  # the frame's deadline runs from its first byte
            c.sent += len(data)
        except OSError:
            self._closed(c)

    def _closed(self, c: PeerConnection) -> None:
        if c.closed is not None:
            return
        c.closed = time.monotonic()
        self._sel.unregister(c.sock)
        c.sock.close()
        self._retry.append(c.kind)

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.02):
                c = key.data
                try:
                    if not c.sock.recv(65536):
                        self._closed(c)
                except BlockingIOError:
                    pass
                except OSError:
                    self._closed(c)
            if time.monotonic() >= next_tick:
                next_tick += self.trickle_s
                retry, self._retry = self._retry, []
                for kind in retry:
                    if not self._stop.is_set():
                        self._open(kind)
                for c in list(self.connections):
                    payload = self._payload(c)
                    if c.closed is None and c.kind.startswith("trickle") and c.sent < len(payload) - 1:
                        self._send(c, payload[c.sent:c.sent + 1])

    def overruns(self, deadlines: dict[str, float]) -> list[float]:
        """Seconds each closed connection outlived its deadline (negative: closed before)."""
        return [c.closed - (c.clock_from + deadlines[c.kind]) for c in self.connections if c.closed is not None]


# --------------------------------------------------------------------------- lease hoarder
class LeaseHoarderForTests:
    """An authenticated peer that asks for a shared-memory lease on every version it is
    told about and never gives one back (the connection stays open); it reconnects when
    the server closes it."""

    def __init__(self, address: str, secret: bytes):
        self.address, self.secret = address, secret
        self.sock: socket.socket | None = None
        self.granted = 0
        self.reconnects = 0

    def lease(self, version: int) -> None:
        for _ in range(2):
            try:
                if self.sock is None:
                    self.sock = connect(self.address)
                    self.sock = client_handshake(self.sock, self.secret)
                self.sock.sendall(frame(W["shm_open_request"], struct.pack("<q", version), request_id=version))
                ftype, status, _, _ = _C_testing.parse_frame(recv_frame(self.sock))
                self.granted += ftype == W["shm_open"] and status == W["reply_ok"]
                return
            except (OSError, ConnectionError):  # revoked: the server closed the connection
                self.close()
                self.reconnects += 1

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# --------------------------------------------------------------------------- the honest one
class LegitPullerForTests:
    """Pulls `version` from `address` again and again in a thread, checking every byte
    against `expected` (name -> tensor); records each pull's seconds and any failure."""

    def __init__(self, address: str, config, expected: dict[str, torch.Tensor], version: int = 1):
        self.puller = WeightPuller(address, config)
        self.expected, self.version = expected, version
        self.seconds: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def pull_once(self) -> float:
        t0 = time.perf_counter()
        pulled = self.puller.pull(self.version, timeout=120)
        took = time.perf_counter() - t0
        for name, t in self.expected.items():
            if not torch.equal(pulled[name], t):
                raise AssertionError(f"{name}: pulled bytes differ")
        return took

    def start(self) -> "LegitPullerForTests":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.seconds.append(self.pull_once())
            except Exception as exc:  # recorded: the test asserts there are none
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=180)
        self.puller.close()
