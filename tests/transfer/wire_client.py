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

from rlboost import _C

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


def recv_frame(sock: socket.socket) -> bytes:
    head = recv_exact(sock, W["header_bytes"])
    length = HEADER.unpack(head)[4]
    return head + recv_exact(sock, length)


def proof(secret: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes, client_id: int = 0) -> bytes:
    msg = label + client_nonce + server_nonce + struct.pack("<Q", client_id)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def connect(address: str, timeout: float = 10.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    return s


# The handshake (format 3): hello(client nonce, client id) -> challenge(server nonce) ->
# auth(client proof) -> welcome(identity + server proof); proofs and the session key bind
# both nonces and the client id; both sides then MAC manifest replies with the session key.
CLIENT_LABEL, SERVER_LABEL = b"rlboost-client-proof-v3", b"rlboost-server-proof-v3"
SESSION_LABEL, MANIFEST_LABEL = b"rlboost-session-key-v3", b"rlboost-manifest-mac-v3"
IDENTITY = struct.pack("<Q", 42) + bytes(16) + struct.pack("<I", 1)  # server id, host key, pid


def seal_manifest(key: bytes, request_id: int, encoded: bytes) -> bytes:
    """A manifest reply body: the encoded manifest and its session MAC."""
    mac = hmac.new(key, MANIFEST_LABEL + struct.pack("<Q", request_id) + encoded, hashlib.sha256).digest()
    return encoded + mac


def hello_body(nonce: bytes, client_id: int) -> bytes:
    return nonce + struct.pack("<Q", client_id)


def client_handshake(sock: socket.socket, secret: bytes, *, wrong_proof: bool = False,
                     client_id: int | None = None) -> bytes | None:
    """Authenticates as a client (a random client id unless given) and returns the session
    key; with wrong_proof, sends a proof that must be refused (and returns None)."""
    nonce = os.urandom(32)
    cid = int.from_bytes(os.urandom(8), "little") if client_id is None else client_id
    sock.sendall(frame(W["hello"], hello_body(nonce, cid)))
    _, _, _, server_nonce = _C.parse_frame(recv_frame(sock))
    assert len(server_nonce) == 32  # the server proves nothing before the client has
    p = os.urandom(32) if wrong_proof else proof(secret, CLIENT_LABEL, nonce, server_nonce, cid)
    sock.sendall(frame(W["auth"], p))
    if wrong_proof:
        return None
    ftype, _, _, body = _C.parse_frame(recv_frame(sock))
    assert ftype == W["welcome"]
    assert hmac.compare_digest(body[-32:], proof(secret, SERVER_LABEL, nonce, server_nonce, cid))
    return proof(secret, SESSION_LABEL, nonce, server_nonce, cid)


def server_handshake_rest(conn: socket.socket, secret: bytes, hello: bytes, server_nonce: bytes) -> bytes:
    """After hello (its body): sends the challenge, takes any auth (unchecked), welcomes
    with a valid proof, and returns the session key."""
    client_nonce, (cid,) = hello[:32], struct.unpack("<Q", hello[32:40])
    conn.sendall(frame(W["challenge"], server_nonce))
    recv_frame(conn)
    conn.sendall(frame(W["welcome"], IDENTITY + proof(secret, SERVER_LABEL, client_nonce, server_nonce, cid)))
    return proof(secret, SESSION_LABEL, client_nonce, server_nonce, cid)


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
    one (a source that stalled mid-version).
    """

    def __init__(self, behavior: str, secret: bytes, payload: bytes):
        self.behavior = behavior
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
        key = server_handshake_rest(conn, self.secret, hello, server_nonce)  # only misbehaves later
        chunk = 4096
        n = (len(self.payload) + chunk - 1) // chunk
        meta = (b'{"format_version":1,"alignment":256,"total_bytes":%d,'
                b'"tensors":[["blob","uint8",[%d],0,%d]]}' % ((len(self.payload),) * 3))
        manifest = native_manifest(self.secret, 1, self.payload, chunk, meta)
        while True:
            head = recv_frame(conn)
            if conn in self._doomed:
                self._doomed.discard(conn)
                conn.shutdown(socket.SHUT_RDWR)
                return
            _, _, ftype, _, _, rid = HEADER.unpack(head[:24])
            if ftype == W["manifest_request"] and self.behavior == "pending_silent":
                unknown_version = struct.pack("<I", 3) + b"version not held here"
                conn.sendall(frame(W["error"], unknown_version, request_id=rid))
            elif ftype == W["manifest_request"]:
                conn.sendall(frame(W["manifest"], seal_manifest(key, rid, manifest), request_id=rid))
            elif ftype == W["have_request"] and self.behavior == "pending_silent":
                self.have_requested.set()
                return self._hold(conn)
            elif ftype == W["have_request"]:
                bits = bytes([0xFF] * (n // 8)) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
                reply = struct.pack("<qIIQ", 1, n, n, 0) + bits + bytes(len(bits))
                conn.sendall(frame(W["have"], reply, request_id=rid))
            elif ftype == W["chunk_request"]:
                version, index = struct.unpack("<qI", head[24:36])
                data = self.payload[index * chunk:(index + 1) * chunk]
                prefix = struct.pack("<qII", version, index, 0)
                if self.behavior == "stalls" and self._chunks_answered >= 4:
                    return self._hold(conn)
                self._chunks_answered += 1
                if self.behavior in ("well_behaved", "first_connection_only", "stalls"):
                    conn.sendall(frame(W["chunk"], prefix + data, request_id=rid))
                elif self.behavior == "wrong_chunk_length":
                    conn.sendall(frame(W["chunk"], prefix + data + b"extra", request_id=rid))
                else:  # close_mid_chunk: announce the whole chunk, send half, vanish
                    conn.sendall(frame(W["chunk"], prefix, request_id=rid, length=16 + len(data)) + data[:len(data) // 2])
                    conn.shutdown(socket.SHUT_RDWR)
                    return
