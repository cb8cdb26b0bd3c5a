"""Cost of moving an in-flight sample between two rollout instances, on the path the
controller takes: two engine processes (Ray actors answering engine_call, as rollout
instances do), the calls the controller's mover makes, and the KV pages going source to
destination through the transfer layer with only a ticket passing this process. It times,
until the destination produces the sample's next token, a resume with its KV pages
(handoff_send -> ticket -> handoff_receive), by re-prefill (export_states -> token-only
states -> submit) and by regenerating its prefix from scratch; plus codec and copy rates
against memcpy, in this process.

The speedup's ceiling is re-prefill time over (one decode step + one memcpy of the batch's
bytes): a handoff whose moving parts cost nothing. Every figure is measured on this CPU.
Usage: python bench/migration_cost.py [--lengths 64,...,4096] [--hops 5] [--no-big] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time

import numpy as np
import ray
import torch

from rlboost.migration.batch import MigrationBatch, pack_batch, unpack_batch
from rlboost.migration.kv import KVLayout, gather_pages_batch, scatter_pages_batch
from rlboost.migration.state import RequestState, SamplingParams, pack_states, unpack_states
from rlboost.models import build_tiny_checkpoint
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.rollout.host import EngineHost
from rlboost.transfer import TransferConfig, WeightPuller, new_secret
from rlboost.transfer.versions import VersionServer, pull_bytes

PROMPT = 16
PATH = "controller path: 2 engine processes (Ray actors), tickets through the transfer layer"
# The tiny test model, and a randomly initialised Qwen3-shaped model of ~54M parameters
# whose prefill costs enough for KV shipping to show what it saves.
MODELS = {
    "tiny": dict(),
    "qwen3-54m": dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_layers=12,
                      num_heads=8, num_kv_heads=4, head_dim=64),
}
WAYS = ("kv", "reprefill")


def build(name: str, root: str, max_len: int) -> str:
    return str(build_tiny_checkpoint(f"{root}/{name}", arch="qwen3", seed=0,
                                     max_position_embeddings=max_len, **MODELS[name]))


def engine_factory(ckpt: str, max_len: int, prefill: int, threads: int):
    """What an instance actor builds: the cache holds one sample of max_len tokens plus
    slack, so nothing is evicted."""
    def make() -> EmbeddedEngine:
        torch.set_num_threads(threads)
        return EmbeddedEngine(EmbeddedEngineConfig(model_dir=ckpt, stream_interval=1, max_model_len=max_len,
                                                   num_blocks=max_len // 16 + 8, max_prefill_tokens=prefill))
    return make


def call(actor, method: str, *args, **kwargs):
    """One call of the engine or handoff protocol, as the controller's RayEngineHandle makes it."""
    return ray.get(actor.engine_call.remote(method, *args, **kwargs))


def next_tokens(actor, sid: int, count: int = 1) -> list[float]:
    """Times (perf_counter, this process) at which each of the next `count` deltas of sid arrived."""
    times = []
    deadline = time.monotonic() + 900
    while len(times) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"sample {sid} produced no token in 900 s")
        deltas = call(actor, "poll", 1.0)
        now = time.perf_counter()
        times += [now for d in deltas if d.sample_id == sid]
    return times


def prefix_state(sid: int, length: int, max_len: int, vocab: int) -> RequestState:
    gen = torch.Generator().manual_seed(sid)
    ids = torch.randint(1, min(vocab, 256), (PROMPT + length,), generator=gen).tolist()
    return RequestState(sample_id=sid, prompt_ids=tuple(ids[:PROMPT]), seed=0, weight_version=0,
                        params=SamplingParams(temperature=1.0, max_new_tokens=max_len - PROMPT),
                        output_ids=tuple(ids[PROMPT:]), output_logprobs=(-1.0,) * length)


def move(src, dst, sid: int, way: str) -> tuple[dict, object]:
    """The controller's moves of one sample (mover.take_back + mover.send): returns the
    seconds of its calls and what to settle once the destination decodes (the release)."""
    t0 = time.perf_counter()
    if way == "kv":
        ticket, _states = call(src, "handoff_send", [sid], "kv")
        t1 = time.perf_counter()
        call(dst, "handoff_receive", ticket, [sid], 60.0)
        t2 = time.perf_counter()
        release = src.engine_call.remote("handoff_release", ticket, [sid])  # as the mover does, after
        return {"send_s": t1 - t0, "receive_s": t2 - t1, "batch_bytes": ticket.nbytes}, release
    batch = call(src, "export_states", [sid], with_kv=False)
    t1 = time.perf_counter()
    call(dst, "submit", list(batch.states))
    return {"send_s": t1 - t0, "receive_s": time.perf_counter() - t1, "batch_bytes": 0}, None


def hops(engines, sid: int, ways: list[str]) -> dict[str, list[dict]]:
    """Hop one sample between the two instances once per entry of ways."""
    out: dict[str, list[dict]] = {w: [] for w in ways}
    here = 0
    for way in ways:
        start = time.perf_counter()
        timing, release = move(engines[here], engines[1 - here], sid, way)
        first, second = next_tokens(engines[1 - here], sid, 2)
        if release is not None:
            ray.get(release)
        out[way].append({**timing, "total_s": first - start, "step_s": second - first,
                         "first_s": first - start - timing["send_s"] - timing["receive_s"]})
        here = 1 - here
    call(engines[here], "abort", [sid])
    return out


def scratch(actor, sid: int, length: int, vocab: int) -> float:
    """Seconds to regenerate a prefix of `length` tokens and produce the next one."""
    state = prefix_state(sid, 0, PROMPT + length + 1, vocab)
    start = time.perf_counter()
    call(actor, "submit", [state])
    deadline = time.monotonic() + 900
    while not any(d.finish_reason for d in call(actor, "poll", 1.0)):
        if time.monotonic() > deadline:
            raise RuntimeError("scratch run did not finish in 900 s")
    return time.perf_counter() - start


def measure_model(name: str, root: str, args) -> list[dict]:
    lengths = args.lengths if name == "tiny" else args.big_lengths
    max_len = max(lengths) + PROMPT + 4 * len(WAYS) * args.hops + 64
    ckpt = build(name, root, max_len)
    transfer = TransferConfig(secret=new_secret(), transport=args.transport)
    instance = ray.remote(EngineHost).options(num_cpus=0)
    engines = [instance.remote(engine_factory(ckpt, max_len, args.prefill, args.threads), transfer, handoff=True)
               for _ in range(2)]
    vocab = MODELS[name].get("vocab_size", 320)
    rows = []
    try:
        limit = args.scratch_max if name == "tiny" else args.big_scratch_max
        for i, length in enumerate([64] + lengths):  # the first pass warms both instances up
            sid = 2 * i + 1
            call(engines[0], "submit", [prefix_state(sid, length, max_len, vocab)])
            next_tokens(engines[0], sid)
            runs = hops(engines, sid, list(WAYS) * args.hops)
            scratch_s = scratch(engines[1], sid + 1, length, vocab) if length <= limit else None
            if i:
                rows.append(summarize(name, length, runs, scratch_s))
    finally:
        for e in engines:
            ray.get(e.engine_call.remote("close"))
            ray.kill(e)
    return rows


def summarize(name: str, length: int, runs: dict[str, list[dict]], scratch_s: float | None) -> dict:
    row = {"model": name, "prefix": length, "scratch_s": scratch_s,
           "batch_bytes": runs["kv"][-1]["batch_bytes"], "step_s": statistics.median(r["step_s"] for r in runs["kv"])}
    for way, results in runs.items():
        for key in ("total_s", "send_s", "receive_s", "first_s"):
            row[f"{way}_{key}"] = statistics.median(r[key] for r in results)
    return row


def best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memcpy_s(nbytes: int, reps: int) -> float:
    """Best copy of nbytes between pre-faulted buffers, on every core (the native copies use them)."""
    a, b = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        return min(best(lambda: b.copy_(a), reps), best(lambda: np.copyto(b.numpy(), a.numpy()), reps))
    finally:
        torch.set_num_threads(threads)


def codec_rates(layout: KVLayout, samples: int, tokens: int, reps: int, transport: str) -> list:
    """(path, bytes, seconds, memcpy seconds of the same bytes) for each codec and copy path."""
    many = [prefix_state(i, tokens, tokens + PROMPT + 1, 256) for i in range(64)]  # a window's worth
    packed_states = pack_states(many)
    blocks = -(-tokens // layout.block_size)
    cache = torch.randn(layout.cache_shape(samples * blocks + 1)).to(layout.torch_dtype)
    perm = torch.randperm(samples * blocks, generator=torch.Generator().manual_seed(0))
    tables = [perm[i * blocks:(i + 1) * blocks].tolist() for i in range(samples)]  # scattered blocks
    counts = [tokens] * samples
    out = torch.zeros(samples * tokens * layout.token_bytes, dtype=torch.uint8)
    kv = gather_pages_batch(cache, layout, tables, counts, out=out)
    batch = MigrationBatch(states=tuple(many[:samples]), kv_layout=layout, kv_tokens=tuple(counts), kv_data=kv)
    packed = pack_batch(batch)
    writable = bytearray(packed)
    config = TransferConfig(secret=new_secret(), relay=False, transport=transport)
    keys = iter(range(1 << 30))

    def ship() -> None:  # what a handoff's bytes cost: served by one end, pulled by the other
        key = next(keys)
        server.serve_bytes(key, packed)
        pull_bytes(puller, server.address, key, len(packed), 60.0)
        server.retire(key)
    with VersionServer(config, config.handoff) as server, WeightPuller((), config) as puller:
        rows = [("states pack (64 samples)", len(packed_states), best(lambda: pack_states(many), reps)),
                ("states unpack (64 samples)", len(packed_states), best(lambda: unpack_states(packed_states), reps)),
                ("batch pack (with KV)", len(packed), best(lambda: pack_batch(batch), reps)),
                ("batch unpack (read-only bytes)", len(packed), best(lambda: unpack_batch(packed), reps)),
                ("batch unpack (writable: zero-copy)", len(packed), best(lambda: unpack_batch(writable), reps)),
                (f"transfer serve + pull ({transport})", len(packed), best(ship, reps)),
                ("KV gather (paged -> bytes)", out.numel(),
                 best(lambda: gather_pages_batch(cache, layout, tables, counts, out=out), reps)),
                ("KV scatter (bytes -> paged)", out.numel(),
                 best(lambda: scatter_pages_batch(cache, layout, tables, counts, kv), reps))]
    return [(path, n, s, memcpy_s(n, reps)) for path, n, s in rows]


def fmt_ms(s: float | None) -> str:
    return f"{s * 1e3:10.1f}" if s is not None else f"{'-':>10}"


def print_tables(rows: list[dict], codec: list, args) -> None:
    print(f"Resume one sample on another instance: ms until the destination's next token, measured on this CPU "
          f"(fp32, {args.threads} thread(s) per engine, prompt {PROMPT} + prefix, median of {args.hops} hops; "
          f"{PATH}; transport {args.transport})")
    print(f"{'model':<10} {'prefix':>6} {'scratch':>10} {'reprefill':>10} {'kv':>10} {'kv x':>6} {'ceiling x':>9} "
          f"{'batch MB':>8}")
    for r in rows:
        print(f"{r['model']:<10} {r['prefix']:>6} {fmt_ms(r['scratch_s'])} {fmt_ms(r['reprefill_total_s'])} "
              f"{fmt_ms(r['kv_total_s'])} {r['reprefill_total_s'] / r['kv_total_s']:6.1f} {r['ceiling']:9.1f} "
              f"{r['batch_bytes'] / 1e6:8.2f}")
    print()
    print("Phases (ms, medians): send = handoff_send (drain, pack, serve) or export_states, with its Ray call; "
          "receive = handoff_receive (pull, unpack, import) or submit; first = then to the next token; "
          "step = the decode step after it")
    print(f"{'model':<10} {'prefix':>6} {'way':<10} {'send':>8} {'receive':>8} {'first':>9} {'step':>7}")
    for r in rows:
        for way in WAYS:
            print(f"{r['model']:<10} {r['prefix']:>6} {way:<10} {r[f'{way}_send_s'] * 1e3:8.2f} "
                  f"{r[f'{way}_receive_s'] * 1e3:8.2f} {r[f'{way}_first_s'] * 1e3:9.2f} {r['step_s'] * 1e3:7.2f}")
    print()
    print(f"{'codec / copy path (this process)':<40} {'MB':>8} {'GB/s':>7} {'memcpy GB/s':>12} {'of memcpy':>10}")
    for path, n, s, mem in codec:
        print(f"{path:<40} {n / 1e6:8.1f} {n / s / 1e9:7.2f} {n / mem / 1e9:12.2f} {mem / s:10.0%}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                        default=[64, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--big-lengths", type=lambda s: [int(x) for x in s.split(",")],
                        default=[256, 1024, 2048], help="prefixes for the ~54M-parameter model")
    parser.add_argument("--hops", type=int, default=5, help="timed hops per way and length")
    parser.add_argument("--prefill", type=int, default=512, help="engine max_prefill_tokens")
    parser.add_argument("--scratch-max", type=int, default=4096, help="longest prefix regenerated (tiny)")
    parser.add_argument("--big-scratch-max", type=int, default=256, help="the same for the big model")
    parser.add_argument("--no-big", action="store_true", help="skip the ~54M-parameter model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each engine process")
    parser.add_argument("--transport", default="auto", help="transfer transport (auto: shm on one host)")
    parser.add_argument("--quick", action="store_true", help="tiny model, short prefixes, few hops")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.hops, args.no_big = [64, 256], 2, True
    return args


def main() -> None:
    args = parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Ray's sockets live under its temp dir, whose path may not exceed 107 bytes: a short one
    with tempfile.TemporaryDirectory(prefix="rlb-ray-", dir="/tmp") as ray_dir, \
            tempfile.TemporaryDirectory() as root:
        ray.init(address="local", num_cpus=2, object_store_memory=128 << 20, include_dashboard=False,
                 log_to_driver=False, _temp_dir=ray_dir)
        try:
            rows = measure_model("tiny", root, args)
            if not args.no_big:
                rows += measure_model("qwen3-54m", root, args)
        finally:
            ray.shutdown()
    codec_layout = KVLayout(num_layers=12, num_kv_heads=4, head_dim=64, block_size=16, dtype="float32")
    codec = codec_rates(codec_layout, samples=4, tokens=256 if args.quick else 2048, reps=3 if args.quick else 5,
                        transport=args.transport)
    copy_rate = max(n / mem for _, n, _, mem in codec)
    for r in rows:
        r["ceiling"] = r["reprefill_total_s"] / (r["step_s"] + r["batch_bytes"] / copy_rate)
    print_tables(rows, codec, args)
    head = headline(rows)
    key = head["prefix"]
    peers = {f"reprefill_ms_{key}": head["reprefill_total_s"] * 1e3, f"kv_ms_{key}": head["kv_total_s"] * 1e3}
    if head["scratch_s"] is not None:
        peers[f"scratch_ms_{key}"] = head["scratch_s"] * 1e3
    peers.update({f"{path.split(' (')[0].replace(' ', '_')}_gbps": n / s / 1e9 for path, n, s, _ in codec[:4]})
    print(json.dumps({"metric": f"kv_resume_speedup_{head['model']}_{key}",
                      "value": head["reprefill_total_s"] / head["kv_total_s"],
                      "unit": f"x (re-prefill time / KV resume time, {head['model']}; {PATH}; measured on this CPU)",
                      "ceiling": head["ceiling"], "peers": peers, "date": datetime.date.today().isoformat()}))


def headline(rows: list[dict]) -> dict:
    """The README's figure: the 54M model at 2048 tokens when measured, else the tiny model's longest."""
    for model in ("qwen3-54m", "tiny"):
        mine = [r for r in rows if r["model"] == model]
        if mine:
            return next((r for r in mine if r["prefix"] == 2048), mine[-1])
    raise RuntimeError("no row measured")


if __name__ == "__main__":
    main()
