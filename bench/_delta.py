"""Parts of bench/delta_weights.py: capturing every version a real GRPO run publishes,
the codec's per-core speed and its peers on those versions, 100 chained deltas through the
real publisher and puller, and the weight sync of 4 instance processes behind a capped
trainer link.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from _common import Child, alloc_prefaulted, free_port, wait_command

RECIPE = "smollm2_cpu"
SYNC_TIMEOUT_S = 600.0


# --------------------------------------------------------------------------- capture
class Captured:
    """The versions a run published, as captured: manifest.json (the tensor table) and one
    v<k>.bin per version."""

    def __init__(self, root: Path):
        self.root = root

    @property
    def versions(self) -> list[int]:
        return sorted(int(p.stem[1:]) for p in self.root.glob("v*.bin"))

    def manifest(self):
        from rlboost.transfer.manifest import Manifest

        doc = (self.root / "manifest.json").read_bytes()
        return Manifest.from_bytes(doc, 1)

    def load(self, version: int, into: np.ndarray | None = None) -> np.ndarray:
        path = self.root / f"v{version}.bin"
        out = into if into is not None else alloc_prefaulted(path.stat().st_size)
        with open(path, "rb") as f:
            f.readinto(memoryview(out))
        return out

    def info(self) -> dict:
        path = self.root / "capture.json"
        return json.loads(path.read_text()) if path.exists() else {}


def capture_run(lr: float, steps: int, root: Path, log) -> Captured:
    """Runs `rlboost train --recipe smollm2_cpu` at `lr` with bf16 weights, and pulls every
    version its trainer publishes (as an instance would: into the previous one, so deltas
    when served) and saves its bytes."""
    from rlboost.errors import TransferError
    from rlboost.transfer import TransferConfig, WeightPuller, new_secret

    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("v*.bin"):
        old.unlink()
    secret, port = new_secret(), free_port()
    env = dict(os.environ, RLBOOST_SECRET=secret.decode(), RLBOOST_RUN_ROOT=str(root / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    cmd = [sys.executable, "-m", "rlboost.cli", "train", "--recipe", RECIPE, "--set", f"run.steps={steps}",
           "--set", f"trainer.optimizer.lr={lr}", "--set", "rollout.embedded.dtype=bfloat16",
           "--set", f"transfer.publisher.port={port}", "--set", f"run.checkpoint_every={steps}",
           "--set", "run.progress=false", "--set", f"run.name=delta-lr{lr:g}"]
    with open(root / "train.log", "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    pulls, held = [], None
    with WeightPuller(f"127.0.0.1:{port}", TransferConfig(secret=secret, relay=False, transport="tcp")) as puller:
        while proc.poll() is None:
            try:
                latest = puller.latest_version()
            except TransferError:  # not serving yet
                time.sleep(0.5)
                continue
            first = latest if held is None else held.version + 1
            for version in range(first, latest + 1):
                held = puller.pull(version, into=held, timeout=600)
                held.buffer[: held.manifest.total_bytes].numpy().tofile(root / f"v{version}.bin")
                if not (root / "manifest.json").exists():
                    (root / "manifest.json").write_bytes(held.manifest.to_bytes())
                s = held.stats
                pulls.append({"version": version, "route": s["route"], "bytes": s["bytes"], "fallback": s["fallback"]})
                log(f"  lr {lr:g}: captured version {version} ({s['route']}, {s['bytes']:,} bytes)")
            time.sleep(0.5)
    if proc.wait() != 0:
        raise RuntimeError(f"rlboost train failed; see {root / 'train.log'}")
    run_dir = sorted((root / "runs").iterdir())[-1]
    (root / "capture.json").write_text(json.dumps({"lr": lr, "steps": steps, "run": str(run_dir), "pulls": pulls}))
    return Captured(root)


def run_metrics(captured: Captured) -> list[dict]:
    run = captured.info().get("run")
    path = Path(run) / "metrics.jsonl" if run else None
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path and path.exists() else []


# --------------------------------------------------------------------------- codec
def encode(a: np.ndarray, b: np.ndarray, threads: int = 2) -> tuple[bytes, dict]:
    from rlboost import _C

    return _C.delta_encode(base=a.ctypes.data, target=b.ctypes.data, nbytes=a.size, base_version=0,
                           target_version=1, threads=threads)


def entropy_bytes(a: np.ndarray, b: np.ndarray) -> float:
    """Zero-order entropy of the (gap, XOR value) symbols of the changed 16-bit words: what
    an ideal coder of each symbol on its own would need."""
    x = a.view(np.uint16) ^ b.view(np.uint16)
    pos = np.flatnonzero(x)
    if pos.size == 0:
        return 0.0
    gaps = np.minimum(np.diff(pos, prepend=-1) - 1, 1 << 20)
    return (_entropy_bits(gaps) + _entropy_bits(x[pos])) / 8


def _entropy_bits(v: np.ndarray) -> float:
    _, counts = np.unique(v, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum() * v.size)


@dataclass
class Speed:
    """Per-core GB/s (payload bytes per CPU second of the one thread doing it), best of runs."""

    encode: float
    apply_in_place: float
    apply_copy: float
    verify: float
    memcpy: float
    xor_pass: float
    zstd_xor: float
    zstd_xor_ratio: float


def _cpu_rate(nbytes: int, fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return nbytes / 1e9 / max(best, 1e-9)


def codec_speed(a: np.ndarray, b: np.ndarray, secret: bytes, zstd: bool) -> Speed:
    """One core's rates on one real pair: every call runs on this thread (threads=1)."""
    import zstandard

    from rlboost import _C

    n = a.size
    delta = np.frombuffer(encode(a, b, threads=1)[0], dtype=np.uint8)
    work, dst = alloc_prefaulted(n), alloc_prefaulted(n)
    args = dict(delta=delta.ctypes.data, delta_bytes=delta.size, nbytes=n, threads=1)

    np.copyto(work, a)
    # XOR is its own inverse: applied again in place, the delta turns b back into a, so
    # every repetition does the same work without a copy in between.
    in_place_rate = _cpu_rate(n, lambda: _C.delta_apply(base=work.ctypes.data, dst=work.ctypes.data, **args),
                              repeats=4)
    copy_rate = _cpu_rate(n, lambda: np.copyto(work, a))
    store = _C.VersionStore(versions_kept=1, secret=secret)
    region = store.stage(1, n)
    np.frombuffer(region, dtype=np.uint8)[:] = b
    manifest = store.commit(1, 8 << 20, b"{}", 1)
    zstd_rate = ratio = 0.0
    if zstd:
        x = np.bitwise_xor(a, b)
        z = zstandard.ZstdCompressor(level=1, threads=0)
        zstd_rate = _cpu_rate(n, lambda: z.compress(x), repeats=1)
        ratio = n / len(z.compress(x))
    return Speed(
        encode=_cpu_rate(n, lambda: encode(a, b, threads=1)),
        apply_in_place=in_place_rate,
        apply_copy=_cpu_rate(n, lambda: _C.delta_apply(base=a.ctypes.data, dst=dst.ctypes.data, **args)),
        verify=_cpu_rate(n, lambda: manifest.mismatched_chunks(address=dst.ctypes.data, nbytes=n, secret=secret,
                                                               threads=1)),
        memcpy=copy_rate, xor_pass=_cpu_rate(n, lambda: np.bitwise_xor(a, b, out=work)),
        zstd_xor=zstd_rate, zstd_xor_ratio=ratio)


# --------------------------------------------------------------------------- publishing raw versions
def publish_bytes(pub, version: int, manifest, flat: np.ndarray) -> None:
    """Publishes a captured version's bytes under its tensor table (one staging copy)."""
    import torch

    from rlboost.transfer.manifest import Manifest

    m = Manifest(version=version, tensors=manifest.tensors, total_bytes=manifest.total_bytes,
                 alignment=manifest.alignment)
    views = pub.stage(version, m)
    src = torch.from_numpy(flat)
    for spec in m.tensors:
        views[spec.name].view(-1).view(torch.uint8).copy_(src[spec.offset: spec.offset + spec.nbytes])
    pub.commit(version)


def chain_exactness(captured: Captured, links: int, lr: float, log) -> dict:
    """Publishes `links` more versions after the run's last one, each the previous float32
    master plus lr * sign(noise) cast to bf16 (synthesized: Adam-sized steps), while a
    puller follows with deltas; then compares its bytes with a fresh full pull."""
    import torch

    from rlboost.transfer import TransferConfig, WeightPublisher, WeightPuller, new_secret

    manifest, last = captured.manifest(), captured.versions[-1]
    flat = captured.load(last)
    bf16 = [s for s in manifest.tensors if s.dtype == "bfloat16"]
    src = torch.from_numpy(flat)
    master = {s.name: src[s.offset: s.offset + s.nbytes].view(torch.bfloat16).float() for s in bf16}
    g = torch.Generator().manual_seed(0)
    config = TransferConfig(secret=new_secret(), transport="tcp")
    routes = []
    with WeightPublisher(config) as pub, WeightPuller(pub.address, config) as follower:
        publish_bytes(pub, 1, manifest, flat)
        held = follower.pull(1)
        for version in range(2, links + 2):
            for s in bf16:
                m = master[s.name]
                m += lr * torch.sign(torch.randn(m.shape, generator=g))
                src[s.offset: s.offset + s.nbytes].view(torch.bfloat16).copy_(m.to(torch.bfloat16).view(m.shape))
            publish_bytes(pub, version, manifest, flat)
            held = follower.pull(version, into=held, timeout=600)
            routes.append(held.stats["route"])
            if version % 20 == 1:
                log(f"  chain: {version - 1} deltas applied")
        with WeightPuller(pub.address, TransferConfig(secret=config.secret, transport="tcp", relay=False)) as fresh:
            full = fresh.pull(links + 1)
        got = hashlib.sha256(held.buffer[: manifest.total_bytes].numpy()).hexdigest()
        want = hashlib.sha256(full.buffer[: manifest.total_bytes].numpy()).hexdigest()
        source = hashlib.sha256(flat).hexdigest()
    return {"links": links, "delta_links": routes.count("delta"), "digest_chain": got, "digest_full": want,
            "digest_source": source, "equal": got == want == source}


# --------------------------------------------------------------------------- weight sync
def serve_instance(conn, secret: bytes, delta: bool) -> None:
    """Child: a rollout instance's puller (relay on); pulls each version it is told to into
    the one it holds and reports when the verified bytes are there."""
    from rlboost.transfer import TransferConfig, WeightPuller

    puller = WeightPuller((), TransferConfig(secret=secret, transport="tcp", delta=delta))
    conn.send(("ready", puller.relay_address))
    sources = wait_command(conn)[1]
    held = None
    while True:
        kind, payload = wait_command(conn, timeout=SYNC_TIMEOUT_S)
        if kind == "stop":
            puller.close()
            return
        held = puller.pull(payload, into=held, sources=sources, timeout=SYNC_TIMEOUT_S)
        s = held.stats
        conn.send(("done", (time.monotonic(), s["route"], s["bytes"],
                            sum(x["bytes"] for x in s["sources"] if x["address"] == sources[0]),
                            {k: v for k, v in s.items() if k.endswith("_s")})))


def weight_sync(captured: Captured, pairs: list[int], instances: int, cap: int, delta: bool) -> list[dict]:
    """For each version k in `pairs`: instances hold k; the trainer publishes k+1 (its
    egress capped at `cap` bytes/s); seconds from the publish returning (the version
    announced, its delta still to encode) until the last instance holds k+1, verified."""
    from rlboost.transfer import ServerConfig, TransferConfig, WeightPublisher, new_secret

    secret = new_secret()
    config = TransferConfig(secret=secret, transport="tcp", delta=delta,
                            publisher=ServerConfig(egress_bytes_per_s=cap))
    manifest = captured.manifest()
    flat = alloc_prefaulted(manifest.total_bytes)
    rounds = []
    with WeightPublisher(config) as pub:
        children = [Child(serve_instance, secret, delta) for _ in range(instances)]
        try:
            relays = [c.expect("ready") for c in children]
            for i, c in enumerate(children):
                c.send("sources", [pub.address, *relays[:i], *relays[i + 1:]])
            published = None
            for k in pairs:
                for version in (k, k + 1):
                    if published is not None and version <= published:
                        continue
                    captured.load(version, into=flat)
                    t0 = time.perf_counter()
                    publish_bytes(pub, version, manifest, flat)
                    publish_s = time.perf_counter() - t0
                    start = time.monotonic()
                    for c in children:
                        c.send("pull", version)
                    done = [c.expect("done", timeout=SYNC_TIMEOUT_S) for c in children]
                    published = version
                    if version == k + 1:
                        pub.wait_for_deltas(60)
                        encoded = [d for d in pub.delta_stats() if d["target"] == version]
                        rounds.append({"version": version, "sync_s": max(d[0] for d in done) - start,
                                       "publish_s": publish_s, "routes": sorted({d[1] for d in done}),
                                       "bytes": sum(d[2] for d in done), "trainer_bytes": sum(d[3] for d in done),
                                       "encode_s": encoded[0].get("total_s", 0.0) if encoded else 0.0,
                                       "instances": [d[4] for d in done]})
                    pub.wait_for_deltas(60)
            for c in children:
                c.send("stop")
        finally:
            for c in children:
                c.close()
    return rounds


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
