"""A weight publisher in its own process, so tests can kill a real server mid-pull.

Run: python -m tests.transfer.serve_weights --nbytes N --seed S [--egress B] [--chunk C]
Prints its address, then serves until stdin closes.
"""

from __future__ import annotations

import argparse
import sys

import torch

from rlboost.transfer import ServerConfig, TransferConfig, WeightPublisher


def payload(nbytes: int, seed: int) -> torch.Tensor:
    """The deterministic bytes such a server publishes (tests rebuild them to compare)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nbytes", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--egress", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=64 << 10)
    ap.add_argument("--secret", default="")
    args = ap.parse_args()
    cfg = TransferConfig(chunk_bytes=args.chunk, publisher=ServerConfig(egress_bytes_per_s=args.egress or None),
                         secret=args.secret.encode())
    with WeightPublisher(cfg) as pub:
        pub.publish(1, {"blob": payload(args.nbytes, args.seed)})
        print(pub.address, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
