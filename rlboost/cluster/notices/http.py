"""One HTTP request to a metadata service, bounded as a whole: connecting, sending, the
status line and headers, and the body all end by one deadline, so an endpoint that trickles
its answer a byte at a time cannot hold a watcher (or a node agent's start) past it.
urllib's timeout bounds each socket operation alone, and a trickle resets it byte by byte.

Stdlib only (http.client over sockets whose every receive waits at most until the deadline).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from urllib.parse import urlsplit

MAX_BODY = 64 << 10  # a metadata answer is a few hundred bytes


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the metadata request ran past its deadline")
    return left


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every receive and send waits at most until `deadline`."""

    deadline = 0.0

    def recv_into(self, buffer, nbytes=0, flags=0):
        self.settimeout(_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize, flags=0):
        self.settimeout(_left(self.deadline))
        return super().recv(bufsize, flags)

    def sendall(self, data, flags=0):
        self.settimeout(_left(self.deadline))
        return super().sendall(data, flags)


class _DeadlineSSLSocket(ssl.SSLSocket):
    """The same for TLS (an https:// metadata URL, behind a proxy of the user's)."""

    deadline = 0.0

    def read(self, len=1024, buffer=None):  # noqa: A002 (ssl's own parameter name)
        self.settimeout(_left(self.deadline))
        return super().read(len, buffer)

    def sendall(self, data, flags=0):
        self.settimeout(_left(self.deadline))
        return super().sendall(data, flags)


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, deadline: float):
        super().__init__(host, port, timeout=_left(deadline))
        self.deadline = deadline

    def connect(self) -> None:
        plain = socket.create_connection((self.host, self.port), _left(self.deadline))
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.deadline = self.deadline
        self.sock = sock


class _TlsConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, deadline: float):
        context = ssl.create_default_context()
        context.sslsocket_class = _DeadlineSSLSocket
        super().__init__(host, port, timeout=_left(deadline), context=context)
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock.deadline = self.deadline


def request(method: str, url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, str, dict]:
    """(status, body, headers) of one request that ends within timeout_s, whole; a 4xx/5xx
    answer is a status, not an error. OSError (TimeoutError among them) when the server
    cannot be reached, does not answer in time, or answers what is not HTTP. No proxy is
    asked: the metadata services are link-local."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    kind = _TlsConnection if parts.scheme == "https" else _Connection
    conn = kind(parts.hostname or "", parts.port, deadline)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(method, target or "/", body=b"" if method in ("PUT", "POST") else None, headers=headers)
        answer = conn.getresponse()
        body = answer.read(MAX_BODY)
        return answer.status, body.decode("utf-8", "replace"), dict(answer.headers)
    except http.client.HTTPException as exc:  # a status line or headers that are not HTTP
        raise OSError(f"not an HTTP answer: {exc!r}") from None
    finally:
        conn.close()
