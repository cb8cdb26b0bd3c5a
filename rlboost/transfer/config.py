"""TransferConfig: every knob of weight publishing and pulling, validated on construction,
with the limits of each server role (trainer publisher, relay, handoff sender) apart, so
capping the trainer's egress leaves relays alone.

No server runs without a secret. A run draws one (``run_secret()``: RLBOOST_SECRET when
set, else ``new_secret()``) and hands the same value to all of its processes. A config
built without one takes RLBOOST_SECRET (read through rlboost.env) when set, else uses this
process's own random secret, so its servers answer only peers in this process. An empty
secret needs ``allow_no_secret=True`` (tests on loopback only).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import secrets
import socket
import sys
import warnings
from dataclasses import dataclass, field

from rlboost import env
from rlboost.validate import require

TRANSPORTS = ("auto", "tcp", "shm", "ucx")
ENCRYPT = ("auto", "on", "off")
ENCRYPT_CODES = {"off": 0, "auto": 1, "on": 2}  # as the native core takes them
_MAX_VERSION_BYTES = 1 << 40  # 1 TiB: any model's weights fit; a run derives its model's bound (version_bytes_bound)
_VERSION_MARGIN = 1.25  # a run's bound over its model's published bytes (dtype casts, alignment, metadata)
_VERSION_SLACK = 64 << 20
_MIN_CHUNK = 4096
_MAX_CHUNK = 256 << 20
_MAX_TIMEOUT_S = 3600.0  # longer deadlines are a mistake, not a need
_RESOLVE_TIMEOUT_S = 3.0  # a live source answers a manifest request in milliseconds
_MAX_RELAY_POLL_S = 60.0  # a source waits this long at most, whatever is asked


def new_secret() -> bytes:
    """A fresh random shared secret (64 hex characters), for one run."""
    return secrets.token_hex(32).encode()


_process_secret: tuple[int, bytes] | None = None  # (pid, secret)


def process_secret() -> bytes:
    """This process's own random secret (drawn at first use; again in a forked child):
    what a config without a secret uses, so nothing outside the process can connect."""
    global _process_secret
    if _process_secret is None or _process_secret[0] != os.getpid():
        _process_secret = (os.getpid(), new_secret())
    return _process_secret[1]


def run_secret() -> bytes:
    """The secret of a run that is starting: RLBOOST_SECRET when set (runs across machines
    whose processes are not all started by one driver), else a fresh random one. Call it
    once per run and pass the result to every process of the run."""
    return env.secret() or new_secret()


def _has_aead() -> bool:
    """Whether the native core was built with AES-256-GCM (OpenSSL's libcrypto)."""
    from rlboost import _C

    return bool(_C.HAS_AEAD)


_warned_clear_text = False


def warn_if_clear_text(config: "TransferConfig", hosts: list[str]) -> None:
    """Warns, once per process, when encrypt is "auto" but this build cannot encrypt and
    bytes would leave loopback (a server bound off loopback, a source on another host)."""
    global _warned_clear_text
    if _warned_clear_text or config.encrypt != "auto" or _has_aead():
        return
    away = [h for h in hosts if not is_loopback(h)]
    if away:
        _warned_clear_text = True
        warnings.warn(f"transfer.encrypt=auto: this build has no libcrypto (rlboost info: HAS_AEAD=False), so "
                      f"weights to and from {away[0]} cross the network in clear text (MACed, not encrypted); "
                      "install libssl-dev and reinstall rlboost, or keep the traffic on a private network",
                      stacklevel=3)


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
class ServerConfig:
    """Limits of one weight server role (the trainer's publisher, a relay, a handoff sender).

    Example: ``ServerConfig(egress_bytes_per_s=500_000_000, versions_kept=2)``.
    """

    port: int = 0
    """port it listens on (0: a free one; fixed, a firewall can admit one port)"""
    egress_bytes_per_s: int | None = None
    """cap on what it sends, bytes/s (None: no cap)"""
    versions_kept: int = 2
    """complete versions it keeps serving"""
    max_connections: int = 256
    """authenticated connections at once; past a cap a stalled, idle or polling one is closed"""
    max_connections_per_peer: int = 96
    """... from one client process"""
    max_connections_per_host: int = 192
    """... from one address"""
    max_handshakes: int = 128
    """connections still authenticating (a quarter per address); the oldest goes first"""

    def __post_init__(self) -> None:
        check_range("port", self.port, 0, 65535)
        if self.egress_bytes_per_s is not None:
            require(self.egress_bytes_per_s >= 1024, "egress_bytes_per_s", ">= 1024 or None", self.egress_bytes_per_s)
        check_range("versions_kept", self.versions_kept, 1, 64)
        check_range("max_connections", self.max_connections, 1, 65536)
        check_range("max_connections_per_peer", self.max_connections_per_peer, 1, 65536)
        check_range("max_connections_per_host", self.max_connections_per_host, 1, 65536)
        check_range("max_handshakes", self.max_handshakes, 1, 65536)


@dataclass(kw_only=True, slots=True)
class TransferConfig:
    """How weights (and handed-off samples) are served and pulled.

    Example: ``TransferConfig(secret=new_secret(), streams=4,
    publisher=ServerConfig(egress_bytes_per_s=500_000_000))``.
    """

    secret: bytes | None = field(default=None, repr=False)
    """the run's shared secret (set by the run, or RLBOOST_SECRET; never written to disk)"""
    allow_no_secret: bool = False
    """tests only: serve and pull with an empty secret on loopback"""
    bind_host: str = "127.0.0.1"
    """address servers listen on (0.0.0.0 across machines)"""
    advertise_host: str | None = None
    """host peers dial (None: bind_host, or the node's address when bound to 0.0.0.0)"""
    transport: str = "auto"
    """auto (same host: shm, else tcp), tcp, shm or ucx (RLBOOST_TRANSPORT overrides)"""
    encrypt: str = "auto"
    """seal every frame and chunk with AES-256-GCM: auto (unless the peer is the source process itself on this host: a same-host relay is sealed too), on (always; refuse peers that cannot), off (only when the peer asks)"""
    max_version_bytes: int = _MAX_VERSION_BYTES
    """largest version a puller takes; a larger announcement is refused before anything is allocated for it"""
    streams: int = 4
    """parallel streams per source"""
    chunk_bytes: int = 8 << 20
    """bytes per chunk (each checked against its tag)"""
    max_in_flight: int = 2
    """chunk requests outstanding per stream"""
    request_timeout_s: float = 60.0
    """deadline of one chunk request"""
    send_timeout_s: float | None = None
    """how long a server keeps sending to a peer that does not read (None: half request_timeout_s)"""
    frame_timeout_s: float = 30.0
    """a request frame must arrive whole within this of its first byte"""
    lease_timeout_s: float | None = None
    """longest shared-memory lease a same-host puller may hold (None: request_timeout_s)"""
    connect_timeout_s: float = 10.0
    """deadline of opening a connection"""
    resolve_timeout_s: float | None = None
    """a source that does not answer a resolve within this is left out (None: min(connect, 3 s))"""
    reconnect_attempts: int = 2
    """reconnects per stream before a source is given up"""
    alignment: int = 4096
    """every tensor starts at a multiple of this many bytes"""
    relay: bool = True
    """pullers re-serve what they hold to their peers"""
    commit_threads: int = 2
    """threads tagging a staged version's chunks"""
    handshake_timeout_s: float = 2.0
    """a connection must authenticate within this, whole"""
    keep_connections: bool = True
    """pullers keep authenticated connections between pulls"""
    connection_idle_s: float = 60.0
    """a kept connection unused this long is closed"""
    relay_poll_s: float = 0.5
    """longest wait of one long poll for news of a peer still pulling"""
    delta: bool = True
    """publish each version also as a lossless delta against the one before; pullers that hold that one take it"""
    delta_threads: int = 2
    """threads encoding a delta (publisher, off the step's critical path) or applying one (puller)"""
    delta_chunk_bytes: int = 1 << 20
    """bytes per chunk of a delta (smaller than chunk_bytes, so a small delta still stripes over sources)"""
    delta_max_fraction: float = 0.5
    """a delta larger than this fraction of its version is not served (pullers then take the full one at once)"""
    delta_wait_s: float = 10.0
    """a puller waits this long for a delta its publisher announced, then pulls the full version"""
    delta_max_chain: int = 4
    """most deltas a puller applies in a row to catch up; further behind, it pulls the full version"""
    publisher: ServerConfig = field(default_factory=ServerConfig)
    relay_server: ServerConfig = field(default_factory=ServerConfig)
    handoff: ServerConfig = field(default_factory=lambda: ServerConfig(versions_kept=64))

    def __post_init__(self) -> None:
        if self.secret is None:
            self.secret = env.secret()
        require(self.secret is None or isinstance(self.secret, bytes), "secret", "bytes or None",
              type(self.secret).__name__)
        require(isinstance(self.allow_no_secret, bool), "allow_no_secret", "True or False", self.allow_no_secret)
        require(self.secret is None or bool(self.secret) or self.allow_no_secret, "secret",
              "non-empty (an empty secret lets anyone connect; allow_no_secret=True in tests only)", self.secret)
        if self.transport == "auto" and env.transport():
            self.transport = env.transport()
        require(self.transport in TRANSPORTS, "transport", f"one of {TRANSPORTS}", self.transport)
        require(self.encrypt in ENCRYPT, "encrypt", f"one of {ENCRYPT}", self.encrypt)
        require(self.encrypt != "on" or _has_aead(), "encrypt",
                "auto or off in a build without OpenSSL's libcrypto (rlboost info: HAS_AEAD=False; install "
                "libssl-dev and reinstall rlboost for 'on')", self.encrypt)
        require(isinstance(self.max_version_bytes, int) and 1 <= self.max_version_bytes <= 1 << 50,
                "max_version_bytes", "an int in [1, 2**50]", self.max_version_bytes)
        require(bool(self.bind_host), "bind_host", "a host name or address", self.bind_host)
        require(self.advertise_host is None or (bool(self.advertise_host) and self.advertise_host not in WILDCARD_HOSTS),
              "advertise_host", "None or a host peers can dial (not 0.0.0.0 or ::)", self.advertise_host)
        if self.allow_no_secret and self.secret == b"" and not is_loopback(self.bind_host):
            raise ValueError(f"allow_no_secret: only for loopback servers, bind_host is {self.bind_host}")
        check_range("streams", self.streams, 1, 64)
        check_range("max_in_flight", self.max_in_flight, 1, 64)
        check_range("chunk_bytes", self.chunk_bytes, _MIN_CHUNK, _MAX_CHUNK)
        self._check_timeouts()
        check_range("reconnect_attempts", self.reconnect_attempts, 0, 100)
        power_of_two = self.alignment > 0 and self.alignment & (self.alignment - 1) == 0
        require(power_of_two and self.alignment <= 1 << 20, "alignment", "a power of two <= 1 MiB", self.alignment)
        check_range("commit_threads", self.commit_threads, 1, 64)
        require(isinstance(self.keep_connections, bool), "keep_connections", "True or False", self.keep_connections)
        require(0 < self.connection_idle_s <= 86400, "connection_idle_s", "in (0, 86400]", self.connection_idle_s)
        require(0.001 <= self.relay_poll_s <= _MAX_RELAY_POLL_S, "relay_poll_s", f"in [0.001, {_MAX_RELAY_POLL_S}]",
              self.relay_poll_s)
        require(isinstance(self.delta, bool), "delta", "True or False", self.delta)
        check_range("delta_threads", self.delta_threads, 1, 64)
        check_range("delta_chunk_bytes", self.delta_chunk_bytes, _MIN_CHUNK, _MAX_CHUNK)
        require(0 < self.delta_max_fraction <= 1, "delta_max_fraction", "in (0, 1]", self.delta_max_fraction)
        require(0 <= self.delta_wait_s <= _MAX_TIMEOUT_S, "delta_wait_s", f"in [0, {_MAX_TIMEOUT_S}]", self.delta_wait_s)
        check_range("delta_max_chain", self.delta_max_chain, 1, 1024)
        for role in ("publisher", "relay_server", "handoff"):
            require(isinstance(getattr(self, role), ServerConfig), role, "a ServerConfig", getattr(self, role))

    def _check_timeouts(self) -> None:
        bound = f"in (0, {_MAX_TIMEOUT_S}]"
        require(0 < self.request_timeout_s <= _MAX_TIMEOUT_S, "request_timeout_s", bound, self.request_timeout_s)
        if self.send_timeout_s is None:
            self.send_timeout_s = self.request_timeout_s / 2
        if self.lease_timeout_s is None:
            self.lease_timeout_s = self.request_timeout_s
        if self.resolve_timeout_s is None:
            self.resolve_timeout_s = min(self.connect_timeout_s, _RESOLVE_TIMEOUT_S)
        for name in ("send_timeout_s", "frame_timeout_s", "lease_timeout_s", "connect_timeout_s", "resolve_timeout_s"):
            require(0 < getattr(self, name) <= _MAX_TIMEOUT_S, name, bound, getattr(self, name))
        require(0 < self.handshake_timeout_s <= 60, "handshake_timeout_s", "in (0, 60]", self.handshake_timeout_s)

    @property
    def relay_poll_ms(self) -> int:
        """relay_poll_s as the native puller takes it."""
        return max(1, round(self.relay_poll_s * 1000))

    def require_secret(self) -> bytes:
        """The secret servers and pullers use: the configured one, else this process's own
        (an empty one only where allow_no_secret asked for it)."""
        if self.secret is not None:
            return self.secret
        if not is_loopback(self.bind_host):
            # peers on other machines must share the secret: this process's own would do no good
            raise ValueError(f"secret: required when bind_host ({self.bind_host}) is not a loopback address; "
                             "a run hands its processes one (run_secret()); elsewhere set TransferConfig(secret=...) "
                             "or RLBOOST_SECRET")
        return process_secret()


def version_bytes_bound(payload_bytes: int) -> int:
    """transfer.max_version_bytes for a run whose versions carry about payload_bytes: a
    margin over it, so a source that announces more (a 2 GiB version to a puller of a small
    model) is refused before anything is allocated."""
    return min(_MAX_VERSION_BYTES, int(payload_bytes * _VERSION_MARGIN) + _VERSION_SLACK)


_SAFETENSORS_ITEM = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                     "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_MAX_HEADER = 100 << 20


def checkpoint_payload_bytes(directory, alignment: int = 4096) -> int:
    """The most a version of the checkpoint in `directory` (its *.safetensors files) takes
    when published: every tensor at 4 bytes an element or its stored width if wider, each
    padded to `alignment`. Reads the files' headers only."""
    import json
    import pathlib
    import struct

    total = 0
    for path in sorted(pathlib.Path(directory).glob("*.safetensors")):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            require(length <= _MAX_HEADER, "checkpoint", f"safetensors headers under {_MAX_HEADER} bytes", path.name)
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            total += count * max(4, _SAFETENSORS_ITEM.get(entry["dtype"], 8)) + alignment
    return total


def check_range(name: str, value: int | float, low: int | float, high: int | float) -> None:
    require(low <= value <= high, name, f"[{low}, {high}]", value)


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
