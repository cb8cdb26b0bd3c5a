"""TransferConfig: every knob of weight publishing and pulling, validated on construction.

The shared secret and the transport override may come from the environment
(RLBOOST_SECRET, RLBOOST_TRANSPORT, read through rlboost.env); explicit values win.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import sys
from dataclasses import dataclass

from rlboost import env

TRANSPORTS = ("auto", "tcp", "shm", "ucx")
_MIN_CHUNK = 4096
_MAX_CHUNK = 256 << 20
_MAX_TIMEOUT_S = 3600.0  # longer deadlines are a mistake, not a need
_RESOLVE_TIMEOUT_S = 3.0  # a live source answers a manifest request in milliseconds


def is_loopback(host: str) -> bool:
    """Whether host (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_address(address: str) -> tuple[str, int]:
    """Splits "host:port" (or "[v6]:port") into (host, port); ValueError when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address must look like 'host:port', got {address!r}")
    return host.strip("[]"), int(port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


WILDCARD_HOSTS = ("0.0.0.0", "::")


def advertised_host(config: "TransferConfig", bound_host: str) -> str:
    """The host a server tells peers to connect to: config.advertise_host, else the host
    it bound, unless that is a wildcard (0.0.0.0, ::), which peers cannot dial: then this
    machine's outgoing address."""
    if config.advertise_host:
        return config.advertise_host
    return this_host_address() if bound_host in WILDCARD_HOSTS else bound_host


def this_host_address() -> str:
    """The address of the interface this machine routes outward through (no packet is
    sent: a UDP connect only picks the route), else its host name's address."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never reached, only routed
            return s.getsockname()[0]
    except OSError:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"


@dataclass(kw_only=True, slots=True)
class TransferConfig:
    """How weights are served and pulled.

    Example: ``TransferConfig(secret=b"s3cret", streams=4, egress_bytes_per_s=500_000_000)``.
    """

    bind_host: str = "127.0.0.1"  # servers listen only here
    advertise_host: str | None = None  # host peers dial; None: bind_host, or this machine's address for 0.0.0.0/::
    port: int = 0  # publisher port; 0 picks a free one
    relay_port: int = 0  # port of a puller's relay server; 0 (ephemeral) lets several pullers share a host
    secret: bytes | None = None  # None: RLBOOST_SECRET, else empty (loopback only)
    transport: str = "auto"  # auto (same host: shm, else tcp) | tcp | shm | ucx
    streams: int = 4  # parallel streams (lanes) per source
    chunk_bytes: int = 8 << 20  # publisher's chunk size (one checksum each)
    max_in_flight: int = 2  # chunk requests outstanding per stream
    request_timeout_s: float = 60.0  # deadline of one chunk request
    # How long a server keeps sending one response to a peer that does not read it, and
    # how long a connection holding a shm/UCX lease may go without a request before it is
    # closed (the memory stays pinned meanwhile); None: half of request_timeout_s, so a
    # relay retiring a version (which waits request_timeout_s) outlasts such a peer.
    send_timeout_s: float | None = None
    connect_timeout_s: float = 10.0
    # The longest one source may take to answer each round of resolving a version (its
    # manifest, what it holds); one that does not is left out of the pull, so a frozen
    # peer cannot hold up the others. None: min(connect_timeout_s, 3 s).
    resolve_timeout_s: float | None = None
    reconnect_attempts: int = 2  # per stream, before a source is given up
    egress_bytes_per_s: int | None = None  # cap on what one server sends; None: no cap
    versions_kept: int = 2  # complete versions a server keeps serving
    alignment: int = 4096  # every tensor starts at a multiple of this
    relay: bool = True  # pullers re-serve what they hold
    commit_threads: int = 2  # parallel tasks checksumming a staged version (a thread per core at most)
    max_connections: int = 256  # authenticated ones per server; when full, the longest idle one is closed
    max_handshakes: int = 128  # per server, still unauthenticated (a quarter per peer host); when full, the oldest is closed
    handshake_timeout_s: float = 2.0  # a connection must authenticate within this
    keep_connections: bool = True  # pullers keep authenticated connections between pulls
    connection_idle_s: float = 60.0  # a kept connection unused this long is closed
    relay_poll_s: float = 0.5  # longest wait of one long poll for news of a peer still pulling

    def __post_init__(self) -> None:
        if self.secret is None:
            self.secret = env.secret() or b""
        if not isinstance(self.secret, bytes):
            raise ValueError(f"secret must be bytes, got {type(self.secret).__name__}")
        if self.transport == "auto" and env.transport():
            self.transport = env.transport()
        _check(self.transport in TRANSPORTS, "transport", f"one of {TRANSPORTS}", self.transport)
        _check(bool(self.bind_host), "bind_host", "a host name or address", self.bind_host)
        _check(self.advertise_host is None or (bool(self.advertise_host) and self.advertise_host not in WILDCARD_HOSTS),
               "advertise_host", "None or a host peers can dial (not 0.0.0.0 or ::)", self.advertise_host)
        if not self.secret and not is_loopback(self.bind_host):
            raise ValueError(
                f"secret: required when bind_host ({self.bind_host}) is not a loopback address; "
                "set TransferConfig(secret=...) or RLBOOST_SECRET"
            )
        for name in ("port", "relay_port"):
            _check(0 <= getattr(self, name) < 65536, name, "[0, 65535]", getattr(self, name))
        _check(1 <= self.streams <= 64, "streams", "[1, 64]", self.streams)
        _check(1 <= self.max_in_flight <= 64, "max_in_flight", "[1, 64]", self.max_in_flight)
        _check(
            _MIN_CHUNK <= self.chunk_bytes <= _MAX_CHUNK,
            "chunk_bytes", f"[{_MIN_CHUNK}, {_MAX_CHUNK}]", self.chunk_bytes,
        )
        _check(0 < self.request_timeout_s <= _MAX_TIMEOUT_S, "request_timeout_s", f"in (0, {_MAX_TIMEOUT_S}]",
               self.request_timeout_s)
        if self.send_timeout_s is None:
            self.send_timeout_s = self.request_timeout_s / 2
        _check(0 < self.send_timeout_s <= _MAX_TIMEOUT_S, "send_timeout_s", f"in (0, {_MAX_TIMEOUT_S}]",
               self.send_timeout_s)
        _check(0 < self.connect_timeout_s <= _MAX_TIMEOUT_S, "connect_timeout_s", f"in (0, {_MAX_TIMEOUT_S}]",
               self.connect_timeout_s)
        if self.resolve_timeout_s is None:
            self.resolve_timeout_s = min(self.connect_timeout_s, _RESOLVE_TIMEOUT_S)
        _check(0 < self.resolve_timeout_s <= _MAX_TIMEOUT_S, "resolve_timeout_s", f"in (0, {_MAX_TIMEOUT_S}]",
               self.resolve_timeout_s)
        _check(0 <= self.reconnect_attempts <= 100, "reconnect_attempts", "[0, 100]", self.reconnect_attempts)
        if self.egress_bytes_per_s is not None:
            _check(self.egress_bytes_per_s >= 1024, "egress_bytes_per_s", ">= 1024 or None", self.egress_bytes_per_s)
        _check(1 <= self.versions_kept <= 64, "versions_kept", "[1, 64]", self.versions_kept)
        power_of_two = self.alignment > 0 and self.alignment & (self.alignment - 1) == 0
        _check(power_of_two and self.alignment <= 1 << 20, "alignment", "a power of two <= 1 MiB", self.alignment)
        _check(1 <= self.commit_threads <= 64, "commit_threads", "[1, 64]", self.commit_threads)
        _check(1 <= self.max_connections <= 65536, "max_connections", "[1, 65536]", self.max_connections)
        _check(1 <= self.max_handshakes <= 65536, "max_handshakes", "[1, 65536]", self.max_handshakes)
        _check(0 < self.handshake_timeout_s <= 60, "handshake_timeout_s", "in (0, 60]", self.handshake_timeout_s)
        _check(isinstance(self.keep_connections, bool), "keep_connections", "True or False", self.keep_connections)
        _check(0 < self.connection_idle_s <= 86400, "connection_idle_s", "in (0, 86400]", self.connection_idle_s)
        _check(0 < self.relay_poll_s <= 60, "relay_poll_s", "in (0, 60]", self.relay_poll_s)


def _check(ok: bool, field: str, allowed: str, got: object) -> None:
    if not ok:
        raise ValueError(f"{field}: must be {allowed}, got {got!r}")


def node_ip() -> str | None:
    """The address of the Ray node this process runs on (None outside Ray). Ray is asked
    only when this process already uses it: the transfer layer does not depend on it."""
    ray = sys.modules.get("ray")
    return ray.util.get_node_ip_address() if ray is not None and ray.is_initialized() else None


def on_this_node(transfer: TransferConfig) -> TransferConfig:
    """Servers bound to a wildcard host advertise this Ray node's address, unless the config
    names one: peers on other nodes dial it. (The machine's outgoing interface, the
    fallback outside Ray, need not be the address the cluster's nodes reach each other on.)"""
    ip = node_ip()
    if transfer.advertise_host is None and transfer.bind_host in WILDCARD_HOSTS and ip:
        return dataclasses.replace(transfer, advertise_host=ip)
    return transfer
