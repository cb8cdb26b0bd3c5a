"""A hand-written client and server for the weight wire format, used by tests to send
hostile frames and to act as a misbehaving source. Built from the format description
(struct + hmac), independent of the native code it tests."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading

from rlboost import _C, _C_testing

W = _C.WIRE
HEADER = struct.Struct("<IHHIIQ")  # magic, format, type, status, length, request id


def frame(ftype: int, body: bytes = b"", *, status: int = 0, request_id: int = 0,
          magic: int = W["magic"], fmt: int = W["format_version"], length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return HEADER.pack(magic, fmt, ftype, status, n, request_id) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += got
    return out


def recv_frame(sock) -> bytes:
    """The next frame, header and body (a Session's: its tag checked and dropped)."""
    if isinstance(sock, Session):
        return sock.recv_frame()
    head = recv_exact(sock, W["header_bytes"])
    length = HEADER.unpack(head)[4]
    return head + recv_exact(sock, length)


def proof(secret: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes, client_id: int = 0) -> bytes:
    """Format 3's proof, kept for tests that send an old-format guess."""
    msg = label + client_nonce + server_nonce + struct.pack("<Q", client_id)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def connect(address: str, timeout: float = 10.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    return s


# The login (format 4): hello(client nonce, client id, flags) -> challenge(server nonce) ->
# auth(client proof) -> welcome(identity, mode, server proof). prk = HMAC(both nonces,
# secret) (HKDF-Extract); the proofs are HMAC(prk, label | hello | challenge [| identity]);
# the frame keys are HKDF-Expand(prk, label | SHA-256(whole login)); every later frame
# carries HMAC(direction key, counter | header | body)[:16] (a chunk's: header and prefix).
CLIENT_LABEL, SERVER_LABEL = b"rlboost-v4 client proof", b"rlboost-v4 server proof"
KEYS_LABEL = b"rlboost-v4 frame keys"
MODE_MAC, MODE_AEAD = 1, 2
IDENTITY = struct.pack("<Q", 42) + bytes(16) + struct.pack("<I", 1)  # server id, host key, pid
TAG = 16


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def login_prk(secret: bytes, hello: bytes, challenge: bytes) -> bytes:
    return _hmac(hello[:32] + challenge, secret)


def frame_keys(prk: bytes, hello: bytes, challenge: bytes, client_proof: bytes, identity: bytes) -> tuple[bytes, bytes]:
    """(client-to-server key, server-to-client key)."""
    info = KEYS_LABEL + hashlib.sha256(hello + challenge + client_proof + identity).digest()
    t1 = _hmac(prk, info + b"\x01")
    return t1, _hmac(prk, t1 + info + b"\x02")


class Session:
    """One side of a logged-in connection speaking format 4's MAC mode: seals what it sends
    (a whole frame as `frame()` builds it) and checks what it receives."""

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes):
        self.sock, self._send_key, self._recv_key = sock, send_key, recv_key
        self._sent = self._received = 0

    def tag(self, key: bytes, counter: int, head: bytes, body: bytes) -> bytes:
        ftype = HEADER.unpack(head)[2]
        covered = body[:16] if ftype == W["chunk"] else body  # a chunk's bytes have their own tag
        return _hmac(key, struct.pack("<Q", counter) + head + covered)[:TAG]

    def seal(self, raw: bytes) -> bytes:
        """A whole frame with this connection's next tag appended."""
        head, body = raw[:W["header_bytes"]], raw[W["header_bytes"]:]
        out = raw + self.tag(self._send_key, self._sent, head, body)
        self._sent += 1
        return out

    def sendall(self, raw: bytes) -> None:
        self.sock.sendall(self.seal(raw))

    def recv_frame(self) -> bytes:
        """The next frame (header and body), its tag checked (AssertionError otherwise)."""
        raw = recv_frame(self.sock)
        got = recv_exact(self.sock, TAG)
        want = self.tag(self._recv_key, self._received, raw[:W["header_bytes"]], raw[W["header_bytes"]:])
        self._received += 1
        assert hmac.compare_digest(got, want), "frame tag does not verify"
        return raw

    def __getattr__(self, name):  # the socket's own methods (close, shutdown, settimeout, ...)
        return getattr(self.sock, name)


def hello_body(nonce: bytes, client_id: int, flags: int = 0) -> bytes:
    return nonce + struct.pack("<QI", client_id, flags)


def client_handshake(sock: socket.socket, secret: bytes, *, wrong_proof: bool = False,
                     client_id: int | None = None) -> Session | None:
    """Authenticates as a client (a random client id unless given) and returns its Session;
    with wrong_proof, sends a proof that must be refused (and returns None)."""
    cid = int.from_bytes(os.urandom(8), "little") if client_id is None else client_id
    hello = hello_body(os.urandom(32), cid)
    sock.sendall(frame(W["hello"], hello))
    _, _, _, challenge = _C_testing.parse_frame(recv_frame(sock))
    assert len(challenge) == 32  # the server proves nothing before the client has
    prk = login_prk(secret, hello, challenge)
    p = os.urandom(32) if wrong_proof else _hmac(prk, CLIENT_LABEL + hello + challenge)
    sock.sendall(frame(W["auth"], p))
    if wrong_proof:
        return None
    ftype, _, _, body = _C_testing.parse_frame(recv_frame(sock))
    assert ftype == W["welcome"]
    identity = body[:-32]
    assert hmac.compare_digest(body[-32:], _hmac(prk, SERVER_LABEL + hello + challenge + identity))
    c2s, s2c = frame_keys(prk, hello, challenge, p, identity)
    return Session(sock, c2s, s2c)


def server_handshake_rest(conn: socket.socket, secret: bytes, hello: bytes, server_nonce: bytes,
                          identity: bytes = IDENTITY) -> Session:
    """After hello (its body): sends the challenge, takes any auth (unchecked), welcomes
    with a valid proof (MAC mode), and returns the server's Session."""
    conn.sendall(frame(W["challenge"], server_nonce))
    client_proof = recv_frame(conn)[W["header_bytes"]:]
    prk = login_prk(secret, hello, server_nonce)
    identity = identity + struct.pack("<I", MODE_MAC)
    conn.sendall(frame(W["welcome"], identity + _hmac(prk, SERVER_LABEL + hello + server_nonce + identity)))
    c2s, s2c = frame_keys(prk, hello, server_nonce, client_proof, identity)
    return Session(conn, s2c, c2s)


def native_manifest(secret: bytes, version: int, payload: bytes, chunk: int, meta: bytes) -> bytes:
    """An encoded manifest of `payload` with the tags a publisher holding `secret` computes."""
    tags = b"".join(_C.chunk_tag(secret, version, i // chunk, payload[i:i + chunk])
                    for i in range(0, len(payload), chunk))
    return _C.Manifest(version=version, total_bytes=len(payload), chunk_bytes=chunk, tags=tags,
                       meta=meta).encode()


def is_closed_by_peer(sock: socket.socket) -> bool:
    """True when the peer has closed the connection (reads EOF or reset)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True


class HostileSourceForTests:
    """A fake weight source that answers the handshake, then misbehaves as `behavior` says.

    Behaviors: "bad_magic", "bad_format", "huge_length", "truncated" (in place of the
    challenge); "wrong_chunk_length", "close_mid_chunk" (after a valid manifest);
    "well_behaved" serves every request correctly, except that after
    `drop_open_connections_on_next_request()` each connection open at that moment is
    closed, unanswered, when its next request arrives (as a source that closed an idle
    connection just as the client reused it); "first_connection_only" serves its first
    connection so, then accepts others and never answers them (a source that froze after
    a puller resolved it); "pending_silent" says it does not hold the version (a peer that
    has not started it) and never answers a held-chunk request (`have_requested` is set
    when the first arrives); "stalls" answers its first four chunk requests and no later
    one (a source that stalled mid-version); "fifo_region" claims to be on this host and
    answers a shared-memory request with `region_fd` of this process (a FIFO, in the tests);
    "huge_version" announces a 2 GiB version in a small manifest; "huge_manifest" announces
    a 100 MiB manifest frame and sends none of it.
    """

    def __init__(self, behavior: str, secret: bytes, payload: bytes, region_fd: int = -1):
        self.behavior = behavior
        self.region_fd = region_fd
        self.secret = secret
        self.payload = payload
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._doomed: set[socket.socket] = set()
        self._closing = False
        self.have_requested = threading.Event()
        self.holding = threading.Event()  # a connection is being held unanswered ...
        self.hold_ended = threading.Event()  # ... and its client has closed one
        self._chunks_answered = 0
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    @property
    def connections_accepted(self) -> int:
        return len(self._conns)

    def drop_open_connections_on_next_request(self) -> None:
        self._doomed = set(self._conns)

    def close(self) -> None:
        self._closing = True
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept loop; close() alone would not
        self._listener.close()
        self._accept.join(timeout=5)
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_frames(conn)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()

    def _hold(self, conn: socket.socket) -> None:
        """Reads and ignores whatever arrives until the client closes the connection."""
        self.holding.set()
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass
        self.hold_ended.set()

    def _serve_frames(self, conn: socket.socket) -> None:
        if self.behavior == "first_connection_only" and conn is not self._conns[0]:
            return self._hold(conn)
        hello = recv_frame(conn)[W["header_bytes"]:]
        server_nonce = os.urandom(32)
        challenge = server_nonce
        early = {
            "bad_magic": frame(W["challenge"], challenge, magic=0xDEADBEEF),
            "bad_format": frame(W["challenge"], challenge, fmt=W["format_version"] + 7),
            "huge_length": frame(W["challenge"], b"", length=0xFFFFFFF0),
            "truncated": frame(W["challenge"], challenge)[:30],
        }
        if self.behavior in early:
            conn.sendall(early[self.behavior])
            conn.shutdown(socket.SHUT_WR)
            recv_exact(conn, 1)  # hold the connection until the client gives up
            return
        identity = IDENTITY
        if self.behavior == "fifo_region":  # a same-host source, so the puller maps its region
            identity = struct.pack("<Q", 42) + local_host_key() + struct.pack("<I", os.getpid())
        session = server_handshake_rest(conn, self.secret, hello, server_nonce, identity)  # misbehaves later
        chunk = 4096
        n = (len(self.payload) + chunk - 1) // chunk
        meta = (b'{"format_version":1,"alignment":256,"total_bytes":%d,'
                b'"tensors":[["blob","uint8",[%d],0,%d]]}' % ((len(self.payload),) * 3))
        manifest = native_manifest(self.secret, 1, self.payload, chunk, meta)
        if self.behavior == "huge_version":  # a 2 GiB version, announced in a 4 KiB manifest
            manifest = _C.Manifest(version=1, total_bytes=2 << 30, chunk_bytes=8 << 20, tags=os.urandom(256 * 16),
                                   meta=meta).encode()
        while True:
            head = session.recv_frame()
            if conn in self._doomed:
                self._doomed.discard(conn)
                conn.shutdown(socket.SHUT_RDWR)
                return
            _, _, ftype, _, _, rid = HEADER.unpack(head[:24])
            if ftype == W["manifest_request"] and self.behavior == "pending_silent":
                unknown_version = struct.pack("<I", 3) + b"version not held here"
                session.sendall(frame(W["error"], unknown_version, request_id=rid))
            elif ftype == W["manifest_request"] and self.behavior == "huge_manifest":
                conn.sendall(frame(W["manifest"], b"", request_id=rid, length=100 << 20))  # and nothing more
                return self._hold(conn)
            elif ftype == W["manifest_request"]:
                session.sendall(frame(W["manifest"], manifest, request_id=rid))
            elif ftype == W["have_request"] and self.behavior == "pending_silent":
                self.have_requested.set()
                return self._hold(conn)
            elif ftype == W["have_request"]:
                bits = bytes([0xFF] * (n // 8)) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
                reply = struct.pack("<qIIQ", 1, n, n, 0) + bits + bytes(len(bits))
                session.sendall(frame(W["have"], reply, request_id=rid))
            elif ftype == W["shm_open_request"] and self.behavior == "fifo_region":
                region = struct.pack("<IIQ", os.getpid(), self.region_fd, len(self.payload))
                session.sendall(frame(W["shm_open"], region, request_id=rid))
            elif ftype == W["chunk_request"]:
                version, index = struct.unpack("<qI", head[24:36])
                data = self.payload[index * chunk:(index + 1) * chunk]
                prefix = struct.pack("<qII", version, index, 0)
                if self.behavior == "stalls" and self._chunks_answered >= 4:
                    return self._hold(conn)
                self._chunks_answered += 1
                if self.behavior in ("well_behaved", "first_connection_only", "stalls", "fifo_region"):
                    session.sendall(frame(W["chunk"], prefix + data, request_id=rid))
                elif self.behavior == "wrong_chunk_length":
                    session.sendall(frame(W["chunk"], prefix + data + b"extra", request_id=rid))
                else:  # close_mid_chunk: announce the whole chunk, send half, vanish
                    conn.sendall(frame(W["chunk"], prefix, request_id=rid, length=16 + len(data)) + data[:len(data) // 2])
                    conn.shutdown(socket.SHUT_RDWR)
                    return


def local_host_key() -> bytes:
    """This machine's host key as the native core computes it (boot id and pid namespace)."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        material = f.read() + "|" + os.readlink("/proc/self/ns/pid")
    return hashlib.sha256(material.encode()).digest()[:16]


def recv_sealed(sock: socket.socket, sealed: bool) -> tuple[bytes, bytes, bytes]:
    """One frame off the wire as (header, body, tag); the tag is empty before the login ends."""
    head = recv_exact(sock, W["header_bytes"])
    body = recv_exact(sock, HEADER.unpack(head)[4])
    return head, body, recv_exact(sock, TAG) if sealed else b""
