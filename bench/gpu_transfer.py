"""GB/s of a weight version from CUDA tensors to CUDA tensors through rlboost's transfer path:
device-to-host into the publisher's staging region (page-locked with cudaHostRegister),
commit (chunk checksums), pull over loopback TCP into pinned host memory, host-to-device.

Ceiling: torch's own device-to-host and host-to-device copies of the same bytes between the
same GPU and pinned memory (cuda.Event timing); every stage is checked byte for byte.
Needs a CUDA device (bench/gpu_check.sh runs it).
Usage: python bench/gpu_transfer.py [--gib 1.0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rlboost.transfer.config import TransferConfig
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.publisher import WeightPublisher
from rlboost.transfer.puller import WeightPuller


def cuda_weights(nbytes: int) -> dict[str, torch.Tensor]:
    """bf16 tensors of 64 MiB each (the last one smaller), filled on the device."""
    g = torch.Generator(device="cuda").manual_seed(0)
    per = 32 << 20  # elements of 2 bytes
    out, left, i = {}, nbytes // 2, 0
    while left > 0:
        n = min(per, left)
        out[f"layer{i}.weight"] = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16)
        left, i = left - n, i + 1
    return out


def copy_rate(dst: torch.Tensor, src: torch.Tensor, repeats: int) -> float:
    """Best GB/s of dst.copy_(src, non_blocking=True), timed with CUDA events."""
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return src.numel() * src.element_size() / best / 1e9


def register(tensor: torch.Tensor) -> bool:
    cudart = torch.cuda.cudart()
    storage = tensor.untyped_storage()
    return cudart.cudaHostRegister(storage.data_ptr(), storage.nbytes(), 0) == cudart.cudaError.success


def one_version(version: int, weights, publisher, puller, config) -> dict:
    """Seconds of each stage for one version, and whether the bytes came back whole."""
    manifest = Manifest.build(version, weights, config.alignment)
    t0 = time.perf_counter()
    views = publisher.stage(version, manifest)
    staging = next(iter(views.values()))
    pinned = register(staging)
    t1 = time.perf_counter()
    for name, t in weights.items():
        views[name].copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    publisher.commit(version)
    t3 = time.perf_counter()
    landing = torch.empty(manifest.total_bytes, dtype=torch.uint8).pin_memory()
    t4 = time.perf_counter()
    pulled = puller.pull(version, into=landing, timeout=600)
    t5 = time.perf_counter()
    back = {name: pulled[name].to("cuda", non_blocking=True) for name in weights}
    torch.cuda.synchronize()
    t6 = time.perf_counter()
    exact = all(torch.equal(back[n].view(torch.uint8), weights[n].view(torch.uint8)) for n in weights)
    if pinned:
        torch.cuda.cudart().cudaHostUnregister(staging.untyped_storage().data_ptr())
    publisher.retire(version)
    return {"register": t1 - t0, "d2h_staging": t2 - t1, "commit": t3 - t2, "pull": t5 - t4,
            "h2d": t6 - t5, "pinned_staging": pinned, "byte_exact": exact}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_transfer: no CUDA device")
    nbytes = int(a.gib * (1 << 30)) // 2 * 2
    weights = cuda_weights(nbytes)
    flat = torch.cat([t.reshape(-1) for t in weights.values()])
    host = torch.empty_like(flat, device="cpu").pin_memory()
    d2h, h2d = copy_rate(host, flat, a.repeats), copy_rate(flat, host, a.repeats)
    del flat
    config = TransferConfig(secret=b"gpu-bench", relay=False)  # the landing buffer is ours alone
    runs = []
    with WeightPublisher(config) as publisher, WeightPuller(publisher.address, config) as puller:
        for r in range(a.repeats):
            runs.append(one_version(r + 1, weights, publisher, puller, config))
    best = {k: min(run[k] for run in runs) for k in ("d2h_staging", "commit", "pull", "h2d")}
    gb = nbytes / 1e9
    total = sum(best.values())
    print(f"{gb:.2f} GB of bf16 weights on {torch.cuda.get_device_name()}, best of {a.repeats}")
    print(f"{'stage':34}{'s':>8}{'GB/s':>8}")
    rows = [("torch D2H into pinned (ceiling)", gb / d2h, d2h), ("torch H2D from pinned (ceiling)", gb / h2d, h2d),
            ("rlboost D2H into staging", best["d2h_staging"], gb / best["d2h_staging"]),
            ("rlboost commit (checksums)", best["commit"], gb / best["commit"]),
            ("rlboost pull over loopback", best["pull"], gb / best["pull"]),
            ("rlboost H2D from pinned landing", best["h2d"], gb / best["h2d"]),
            ("rlboost end to end", total, gb / total)]
    for label, seconds, rate in rows:
        print(f"{label:34}{seconds:8.3f}{rate:8.2f}")
    pinned = all(run["pinned_staging"] for run in runs)
    exact = all(run["byte_exact"] for run in runs)
    print(f"staging page-locked: {pinned}; byte-exact: {exact}")
    print(json.dumps({"metric": "gpu_weight_transfer_end_to_end", "value": round(gb / total, 3), "unit": "GB/s",
                      "ceiling": round(min(d2h, h2d), 3),
                      "peers": {"torch_d2h_pinned": round(d2h, 3), "torch_h2d_pinned": round(h2d, 3)},
                      "stages_gbps": {k: round(gb / v, 3) for k, v in best.items()},
                      "pinned_staging": pinned, "byte_exact": exact}))
    if not exact:
        raise SystemExit("gpu_transfer: bytes differ after the round trip")


if __name__ == "__main__":
    main()
