"""Pulls beside long polls: the time a puller takes to pull a complete version from a relay
while 8 other relays long-poll that relay for a second version it is still receiving (every
chunk that lands there is news to all 8), against the same pull with no one polling.

Measured on this CPU, between processes on loopback (TCP). The ceiling is the same pull
with no relay pulling and no one polling; the peer is the pull with the relay filling but
nobody polling it.

    python bench/transfer_long_polls.py [--size 256M] [--pollers 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from rlboost.transfer import ServerConfig, TransferConfig, WeightPublisher, WeightPuller, new_secret  # noqa: E402

from _common import emit_json, fmt_size, gbps, hardware_tag, parse_size, render_table  # noqa: E402

TRICKLE_BYTES_PER_S = 4 << 20  # the second version reaches the relay slowly: chunks land for the whole run
TRICKLE_CHUNK = 64 << 10


def config(secret: bytes, **kw) -> TransferConfig:
    return TransferConfig(secret=secret, delta=False, **kw)


def timed_pulls(address: str, secret: bytes, repeats: int, into: torch.Tensor) -> list[float]:
    out = []
    with WeightPuller(address, config(secret, transport="tcp", relay=False)) as puller:
        for _ in range(repeats + 1):  # the first pull warms the connections up
            t0 = time.perf_counter()
            puller.pull(1, into=into, timeout=300)
            out.append(time.perf_counter() - t0)
    return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="256M")
    ap.add_argument("--pollers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    size, secret = parse_size(args.size), new_secret()
    first = {"w": torch.randint(0, 256, (size,), dtype=torch.uint8)}
    second = {"w": torch.randint(0, 256, (size // 16,), dtype=torch.uint8)}
    into = torch.empty(size + (1 << 20), dtype=torch.uint8)
    rows, figures = [], {}
    with WeightPublisher(config(secret)) as fast, \
            WeightPublisher(config(secret, chunk_bytes=TRICKLE_CHUNK,
                                   publisher=ServerConfig(egress_bytes_per_s=TRICKLE_BYTES_PER_S))) as slow:
        fast.publish(1, first)
        slow.publish(2, second)
        relay = WeightPuller(fast.address, config(secret, transport="tcp"))
        relay.pull(1, timeout=300)
        figures["alone"] = timed_pulls(relay.relay_address, secret, args.repeats, into)
        filling = relay.prepare(2, sources=[slow.address]).start()
        figures["relay filling"] = timed_pulls(relay.relay_address, secret, args.repeats, into)
        pollers = [WeightPuller(relay.relay_address, config(secret, transport="tcp", relay=False))
                   for _ in range(args.pollers)]
        handles = [p.prepare(2).start() for p in pollers]
        figures[f"filling + {args.pollers} polling"] = timed_pulls(relay.relay_address, secret, args.repeats, into)
        for h in handles:
            h.cancel()
        filling.cancel()
        for p in pollers:
            p.close()
        relay.close()
    for name, times in figures.items():
        med = statistics.median(times)
        rows.append([name, f"{med * 1e3:.0f} ms", f"{gbps(size, med):.2f}", f"{med / statistics.median(figures['alone']):.2f}"])
    render_table(f"pull of {fmt_size(size)} from a relay (TCP, {hardware_tag()}, measured on this CPU; "
                 f"load {os.getloadavg()[0]:.1f})", ["while", "median", "GB/s", "x alone"], rows)
    polled = statistics.median(figures[f"filling + {args.pollers} polling"])
    emit_json("pull_gbps_with_long_polls", round(gbps(size, polled), 3), "GB/s",
              round(gbps(size, statistics.median(figures["alone"])), 3),
              {"relay_filling": round(gbps(size, statistics.median(figures["relay filling"])), 3),
               "pollers": args.pollers, "fidelity": "measured on this CPU"})


if __name__ == "__main__":
    main()
