"""rlboost.transfer under the bandwidth harness: pull bandwidth per transport, the time to
provision newcomers from a trainer whose egress is capped, with and without relay, and the
per-core cost of the chunk integrity check against other checks it could have used.

The publisher and every newcomer run in their own process, all holding the run's one
secret (handed to each child); destinations are pre-faulted and reused through `into=`, so
a figure is the pull itself (tags verified), not page faults.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time

import numpy as np

from _common import Child, MiB, WrongBytes, alloc_prefaulted, digest, open_payload, wait_command
from _peers import SocketSession

PARAM_BYTES = 32 * MiB  # the payload is cut into tensors of this size, like parameters
PULL_TIMEOUT_S = 300.0
_SECRET: list[bytes] = []  # the bench run's secret, drawn once (children get it as an argument)


def run_secret() -> bytes:
    if not _SECRET:
        from rlboost.transfer import new_secret

        _SECRET.append(new_secret())
    return _SECRET[0]


def built_transports() -> list[str]:
    from rlboost import _C

    return [t["name"] for t in _C.transports()]


def named_views(buf: np.ndarray, nbytes: int) -> dict:
    """The first nbytes of buf as bfloat16 tensors named like checkpoint parameters."""
    import torch

    flat = torch.from_numpy(buf[:nbytes])
    return {
        f"layers.{i}.weight": flat[off : min(off + PARAM_BYTES, nbytes)].view(torch.bfloat16)
        for i, off in enumerate(range(0, nbytes, PARAM_BYTES))
    }


def _config(secret: bytes, transport: str, relay: bool = False, egress_cap: int | None = None,
            overrides: dict | None = None):
    from rlboost.transfer import ServerConfig, TransferConfig

    return TransferConfig(secret=secret, transport=transport, relay=relay,
                          publisher=ServerConfig(egress_bytes_per_s=egress_cap), **(overrides or {}))


# --------------------------------------------------------------------------- publisher
def serve_publisher(conn, path: str, max_bytes: int, transport: str,
                    egress_cap: int | None, secret: bytes) -> None:
    """Child: a trainer-side publisher that publishes the payload's first n bytes on demand."""
    from rlboost.transfer import WeightPublisher

    src = open_payload(path, max_bytes)
    with WeightPublisher(_config(secret, transport, egress_cap=egress_cap)) as pub:
        conn.send(("ready", pub.address))
        while True:
            kind, payload = wait_command(conn)
            if kind == "stop":
                return
            version, nbytes = payload
            pub.publish(version, named_views(src, nbytes))
            conn.send(("published", version))


class Publisher:
    """A publisher child with its address; publishes each payload size once, on demand."""

    def __init__(self, path: str, max_bytes: int, egress_cap: int | None = None):
        self.child = Child(serve_publisher, path, max_bytes, "auto", egress_cap, run_secret())
        self.address = self.child.expect("ready")
        self.versions: dict[int, int] = {}

    def publish(self, nbytes: int) -> int:
        """The version holding the payload's first nbytes (published on first use)."""
        if nbytes not in self.versions:
            version = len(self.versions) + 1
            self.child.send("publish", (version, nbytes))
            self.child.expect("published")
            self.versions[nbytes] = version
        return self.versions[nbytes]

    def close(self) -> None:
        self.child.send("stop")
        self.child.close()


class PullSession:
    """rlboost pull over one transport into the shared destination (relay off)."""

    def __init__(self, publisher: Publisher, transport: str, dst: np.ndarray,
                 overrides: dict | None = None, encrypt: bool = False):
        import torch

        from rlboost.transfer import WeightPuller

        overrides = {**(overrides or {}), **({"encrypt": "on"} if encrypt else {})}
        self.publisher, self.into = publisher, torch.from_numpy(dst)
        self.puller = WeightPuller([publisher.address], _config(run_secret(), transport, overrides=overrides))
        self.key, self.peer, self.note = f"{transport}_pull", f"rlboost pull ({transport})", ""
        if encrypt:  # the puller asks, so the publisher seals (AES-256-GCM) every frame and chunk
            self.key, self.peer = f"{transport}_enc_pull", f"rlboost pull ({transport}, AES-256-GCM)"""
        self.sender_pids = (publisher.child.proc.pid,)
        self.version = 0

    def prepare(self, nbytes: int) -> None:
        self.version = self.publisher.publish(nbytes)

    def once(self, nbytes: int) -> None:
        self.puller.pull(version=self.version, into=self.into, timeout=PULL_TIMEOUT_S)

    def close(self) -> None:
        self.puller.close()


# --------------------------------------------------------------------------- provisioning
@dataclasses.dataclass(slots=True)
class Provision:
    """Seconds from 'go' until the last of `newcomers` pullers held the whole version."""

    nbytes: int
    newcomers: int
    relay: bool
    seconds: list[float]
    peer_share: list[float]  # fraction of all bytes the newcomers got from each other
    sources_used: int  # most sources any newcomer pulled from in the last round

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def serve_newcomer(conn, nbytes: int, transport: str, overrides: dict | None, secret: bytes) -> None:
    """Child: one newcomer. Per round: open a puller (serving what it holds when relaying),
    announce its address, pull on 'go', report when done, close on 'close'."""
    import torch

    from rlboost.transfer import WeightPuller

    dst = alloc_prefaulted(nbytes)
    into = torch.from_numpy(dst)
    conn.send(("ready", None))
    while True:
        kind, payload = wait_command(conn)
        if kind == "stop":
            return
        version, relay = payload
        with WeightPuller([], _config(secret, transport, relay=relay, overrides=overrides)) as puller:
            conn.send(("address", puller.relay_address))
            _, sources = wait_command(conn)
            pulled = puller.pull(version=version, into=into, sources=sources,
                                 timeout=PULL_TIMEOUT_S)
            end = time.monotonic()
            used = pulled.stats["sources"]
            from_peers = sum(s["bytes"] for s in used if s["address"] != sources[0])
            conn.send(("done", (end, digest(dst), from_peers, len(used))))
            wait_command(conn)  # keep serving peers until every newcomer is done


def _one_round(trainer: Child, trainer_addr: str, comers: list[Child], version: int,
               nbytes: int, relay: bool, expect: str) -> tuple[float, float, int]:
    trainer.send("publish", (version, nbytes))
    trainer.expect("published")
    for c in comers:
        c.send("round", (version, relay))
    addresses = [c.expect("address") for c in comers]
    t_go = time.monotonic()
    for i, c in enumerate(comers):
        peers = [a for j, a in enumerate(addresses) if j != i and a] if relay else []
        c.send("go", [trainer_addr, *peers])
    ends, from_peers, used = [], 0, 0
    for c in comers:
        end, got, peer_bytes, n_sources = c.expect("done", timeout=PULL_TIMEOUT_S)
        if got != expect:
            raise WrongBytes("a newcomer received the wrong bytes")
        ends.append(end)
        from_peers += peer_bytes
        used = max(used, n_sources)
    for c in comers:
        c.send("close")
    return max(ends) - t_go, from_peers / (nbytes * len(comers)), used


def measure_provisioning(nbytes: int, counts: tuple[int, ...], egress_cap: int, repeats: int,
                         path: str, expect: str, overrides: dict | None = None,
                         transport: str = "tcp") -> list[Provision]:
    """Time to provision 1..N simultaneous newcomers, without and with relay
    (`overrides`: TransferConfig fields for the newcomers' pullers)."""
    out = []
    with Child(serve_publisher, path, nbytes, transport, egress_cap, run_secret()) as trainer:
        trainer_addr = trainer.expect("ready")
        comers = [Child(serve_newcomer, nbytes, transport, overrides, run_secret())
                  for _ in range(max(counts))]
        try:
            for c in comers:
                c.expect("ready")
            version = 0
            for count in counts:
                for relay in (False, True):
                    seconds, shares = [], []
                    for _ in range(repeats):
                        version += 1
                        took, share, used = _one_round(trainer, trainer_addr, comers[:count],
                                                       version, nbytes, relay, expect)
                        seconds.append(took)
                        shares.append(share)
                    out.append(Provision(nbytes, count, relay, seconds, shares, used))
        finally:
            for c in comers:
                c.send("stop")
                c.close()
        trainer.send("stop")
    return out


# --------------------------------------------------------------------------- small pulls
@dataclasses.dataclass(slots=True)
class Latency:
    """Milliseconds per transfer of a small payload, one row of the latency table."""

    key: str
    path: str
    nbytes: int
    millis: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.millis)

    @property
    def p90(self) -> float:
        return sorted(self.millis)[int(0.9 * (len(self.millis) - 1))]


def measure_latency(path: str, dst: np.ndarray, nbytes: int, repeats: int, expect: str,
                    overrides: dict | None = None) -> list[Latency]:
    """Per-transfer time of an nbytes payload (a migration batch, say): rlboost pulls that
    keep their connections or connect anew, and a raw socket round trip on an open
    connection (the floor), alternating run by run."""
    import torch

    from rlboost.transfer import WeightPuller

    into = torch.from_numpy(dst)
    publisher = Publisher(path, nbytes)
    closers = [publisher.close]
    try:
        version = publisher.publish(nbytes)
        jobs = {}
        for transport in ("tcp", "shm"):
            for keep in (True, False):
                puller = WeightPuller([publisher.address], _config(
                    run_secret(), transport, overrides={**(overrides or {}), "keep_connections": keep}))
                closers.append(puller.close)
                label = f"rlboost pull ({transport}, {'kept' if keep else 'new'} connections)"
                jobs[(f"{transport}_{'kept' if keep else 'new'}", label)] = (
                    lambda p=puller: p.pull(version=version, into=into, timeout=PULL_TIMEOUT_S))
        sock = SocketSession(dst, path, nbytes)
        closers.append(sock.close)
        jobs[("socket", "raw socket (open connection)")] = lambda: sock.once(nbytes)
        times = {key: [] for key in jobs}
        for i in range(repeats + 1):  # the first round is a warm-up
            for key, job in jobs.items():
                t0 = time.perf_counter()
                job()
                if i:
                    times[key].append((time.perf_counter() - t0) * 1e3)
                if i == repeats and digest(dst[:nbytes]) != expect:
                    raise WrongBytes(f"{key[1]}: the payload arrived with the wrong content")
    finally:
        for close in reversed(closers):
            close()
    return [Latency(key, label, nbytes, millis) for (key, label), millis in times.items()]


# --------------------------------------------------------------------------- check cost
@dataclasses.dataclass(slots=True)
class CheckCost:
    """GB/s one core checks (CPU time of this thread, so other load does not skew it)."""

    key: str
    name: str
    gbps: float
    note: str


def measure_check_costs(buf: np.ndarray, repeats: int = 3) -> list[CheckCost]:
    """The chunk check rlboost uses (POLYVAL, then one HMAC per chunk) against CRC-32C (not
    a defence against forgery) and SHA-256 (OpenSSL, with SHA-NI where the CPU has it), on
    the same resident bytes: what each would cost the receiving core per GB."""
    from rlboost import _C

    key = bytes(range(16))
    view = memoryview(buf)
    checks = [
        ("polyval", "POLYVAL (rlboost's chunk tag)", lambda: _C.polyval(key, view),
         "carry-less multiply" + (" (VPCLMULQDQ)" if _C.polyval_uses_hardware() else " (portable)")),
        ("crc32c", "CRC-32C (accidents only)", lambda: _C.crc32c(view), "SSE4.2 crc32"),
        ("sha256", "SHA-256 (OpenSSL)", lambda: hashlib.sha256(view).digest(), "SHA-NI when present"),
    ]
    out = []
    for k, name, fn, note in checks:
        best = min(_thread_seconds(fn) for _ in range(repeats))
        out.append(CheckCost(k, name, len(buf) / 1e9 / best, note))
    return out


def _thread_seconds(fn) -> float:
    t0 = time.thread_time()
    fn()
    return max(time.thread_time() - t0, 1e-9)
