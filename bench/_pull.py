"""rlboost.transfer under the bandwidth harness: pull bandwidth per transport, and the time
to provision newcomers from a trainer whose egress is capped, with and without relay.

The publisher and every newcomer run in their own process; destinations are pre-faulted
and reused through `into=`, so a figure is the pull itself, not page faults.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
import traceback

import numpy as np
from rlboost.errors import TransferError

from _common import (
    MiB,
    Child,
    Missing,
    Row,
    Schedule,
    alloc_prefaulted,
    digest,
    source_buffer,
    time_runs,
    wait_command,
)
from _peers import Expect, WrongBytes, check

PARAM_BYTES = 32 * MiB  # the payload is cut into tensors of this size, like parameters
PULL_TIMEOUT_S = 300.0


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


def _config(transport: str, relay: bool = False, egress_cap: int | None = None):
    from rlboost.transfer import TransferConfig

    return TransferConfig(transport=transport, relay=relay, egress_bytes_per_s=egress_cap)


# --------------------------------------------------------------------------- publisher
def serve_publisher(conn, seed: int, max_bytes: int, transport: str,
                    egress_cap: int | None) -> None:
    """Child: a trainer-side publisher that publishes the payload's first n bytes on demand."""
    from rlboost.transfer import WeightPublisher

    src = source_buffer(max_bytes, seed)
    with WeightPublisher(_config(transport, egress_cap=egress_cap)) as pub:
        conn.send(("ready", pub.address))
        while True:
            kind, payload = wait_command(conn)
            if kind == "stop":
                return
            version, nbytes = payload
            pub.publish(version, named_views(src, nbytes))
            conn.send(("published", version))


def measure_pulls(dst: np.ndarray, schedule: Schedule, seed: int, expect: Expect,
                  transports: list[str]) -> tuple[list[Row], list[Missing]]:
    """Pull each payload from one publisher in another process, into the same destination,
    over each transport in turn (interleaved per size, so load changes hit all alike)."""
    import torch
    from rlboost.transfer import WeightPuller

    rows, failed, into = [], {}, torch.from_numpy(dst)
    with Child(serve_publisher, seed, max(schedule.sizes), "auto", None) as pub:
        address = pub.expect("ready")
        pullers = {t: WeightPuller([address], _config(t)) for t in transports}
        try:
            for version, n in enumerate(schedule.sizes, start=1):
                pub.send("publish", (version, n))
                pub.expect("published")
                for t, puller in pullers.items():
                    if t in failed:
                        continue
                    try:
                        rows.append(_time_pull(puller, t, version, n, into, schedule, expect))
                    except TransferError as exc:
                        traceback.print_exc(file=sys.stderr)
                        failed[t] = f"failed: {str(exc).splitlines()[0][:80]}"
        finally:
            for puller in pullers.values():
                puller.close()
        pub.send("stop")
    return rows, [Missing(f"rlboost pull ({t})", why) for t, why in failed.items()]


def _time_pull(puller, transport: str, version: int, n: int, into, schedule: Schedule,
               expect: Expect) -> Row:
    dst = into.numpy()
    dst[:n] = 0
    times = time_runs(lambda: puller.pull(version=version, into=into, timeout=PULL_TIMEOUT_S),
                      schedule)
    check(f"{transport} pull", digest(dst[:n]), expect, n)
    return Row(f"{transport}_pull", f"rlboost pull ({transport})", n, times)


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


def serve_newcomer(conn, nbytes: int, transport: str) -> None:
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
        with WeightPuller([], _config(transport, relay=relay)) as puller:
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
                         seed: int, expect: str, transport: str = "tcp") -> list[Provision]:
    """Time to provision 1..N simultaneous newcomers, without and with relay."""
    out = []
    with Child(serve_publisher, seed, nbytes, transport, egress_cap) as trainer:
        trainer_addr = trainer.expect("ready")
        comers = [Child(serve_newcomer, nbytes, transport) for _ in range(max(counts))]
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
