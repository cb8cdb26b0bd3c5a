"""Cost of moving an in-flight sample between two engines: the time until the destination
produces its next token when the sample resumes by KV shipping, by re-prefill, or by
regenerating its prefix from scratch; plus codec and KV page copy rates against memcpy.

Each resume is timed from the start of the handoff (export, pack, ship, unpack, import)
to the first new token on the destination. The speedup's ceiling is re-prefill time over
(one decode step + one memcpy of the KV bytes): a handoff whose moving parts cost nothing.
Usage: python bench/migration_cost.py [--lengths 64,...,4096] [--hops 5] [--no-big] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from rlboost.migration.batch import MigrationBatch, pack_batch, unpack_batch
from rlboost.migration.kv import KVLayout, gather_pages_batch, scatter_pages_batch
from rlboost.migration.state import RequestState, SamplingParams, pack_states, unpack_states
from rlboost.models import build_tiny_checkpoint
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.rollout.handoff.migrate import InProcessChannel, TransferChannel, migrate
from rlboost.transfer import TransferConfig

PROMPT = 16
# The tiny test model, and a randomly initialised Qwen3-shaped model of ~54M parameters
# whose prefill costs enough for KV shipping to show what it saves.
MODELS = {
    "tiny": dict(),
    "qwen3-54m": dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_layers=12,
                      num_heads=8, num_kv_heads=4, head_dim=64),
}


def build(name: str, root: str, max_len: int) -> str:
    return str(build_tiny_checkpoint(f"{root}/{name}", arch="qwen3", seed=0,
                                     max_position_embeddings=max_len, **MODELS[name]))


def engine(ckpt: str, max_len: int, prefill: int) -> EmbeddedEngine:
    # The cache holds one sample of max_len tokens plus slack, so nothing is evicted.
    return EmbeddedEngine(EmbeddedEngineConfig(
        model_dir=ckpt, stream_interval=1, max_model_len=max_len, num_blocks=max_len // 16 + 8,
        max_prefill_tokens=prefill))


def next_token(engine: EmbeddedEngine, sid: int, count: int = 1) -> list[float]:
    """Times (perf_counter) at which each of the next `count` deltas of sample sid arrived."""
    times = []
    deadline = time.monotonic() + 900
    while len(times) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"sample {sid} produced no token in 900 s")
        deltas = engine.poll(1.0)
        now = time.perf_counter()
        times += [now for d in deltas if d.sample_id == sid]
    return times


def prefix_state(sid: int, length: int, max_len: int, vocab: int) -> RequestState:
    gen = torch.Generator().manual_seed(sid)
    ids = torch.randint(1, min(vocab, 256), (PROMPT + length,), generator=gen).tolist()
    return RequestState(sample_id=sid, prompt_ids=tuple(ids[:PROMPT]), seed=0, weight_version=0,
                        params=SamplingParams(temperature=1.0, max_new_tokens=max_len - PROMPT),
                        output_ids=tuple(ids[PROMPT:]), output_logprobs=(-1.0,) * length)


# How a sample resumes: handoff mode, and whether the batch ships over the transfer layer.
WAYS = {"kv": ("kv", False), "tokens": ("tokens", False), "kv_transfer": ("kv", True)}


def hops(engines, sid: int, ways: list[str], channel: TransferChannel) -> dict[str, list]:
    """Hop one sample between the two engines once per entry of ways; per way a list of
    (seconds to the next token, decode step seconds after it, HandoffResult)."""
    out: dict[str, list] = {w: [] for w in ways}
    here = 0
    for way in ways:
        mode, over_transfer = WAYS[way]
        start = time.perf_counter()
        result = migrate(engines[here], engines[1 - here], [sid], mode=mode,
                         channel=channel if over_transfer else None)
        first, second = next_token(engines[1 - here], sid, 2)
        out[way].append((first - start, second - first, result))
        here = 1 - here
    engines[here].abort([sid])
    return out


def scratch(engine: EmbeddedEngine, sid: int, length: int, vocab: int) -> float:
    """Seconds to regenerate a prefix of `length` tokens and produce the next one."""
    state = prefix_state(sid, 0, PROMPT + length + 1, vocab)
    start = time.perf_counter()
    engine.submit([state])
    deadline = time.monotonic() + 900
    while True:
        if any(d.finish_reason for d in engine.poll(1.0)):
            return time.perf_counter() - start
        if time.monotonic() > deadline:
            raise RuntimeError("scratch run did not finish in 900 s")


def measure_model(name: str, root: str, args) -> list[dict]:
    lengths = args.lengths if name == "tiny" else args.big_lengths
    max_len = max(lengths) + PROMPT + 4 * len(WAYS) * args.hops + 64
    ckpt = build(name, root, max_len)
    engines = [engine(ckpt, max_len, args.prefill), engine(ckpt, max_len, args.prefill)]
    vocab = engines[0].model_config.vocab_size
    channel = TransferChannel(TransferConfig(relay=False, transport=args.transport))
    rows = []
    try:
        limit = args.scratch_max if name == "tiny" else args.big_scratch_max
        for i, length in enumerate([64] + lengths):  # the first pass warms both engines up
            sid = 2 * i + 1
            engines[0].submit([prefix_state(sid, length, max_len, vocab)])
            next_token(engines[0], sid)
            runs = hops(engines, sid, list(WAYS) * args.hops, channel)
            scratch_s = scratch(engines[1], sid + 1, length, vocab) if length <= limit else None
            if i:
                rows.append(summarize(name, length, runs, scratch_s))
    finally:
        channel.close()
        for e in engines:
            e.close()
    return rows


PHASES = ("drain_s", "pack_s", "ship_s", "unpack_s", "resume_s")


def summarize(name: str, length: int, runs: dict[str, list], scratch_s: float | None) -> dict:
    row = {"model": name, "prefix": length, "scratch_s": scratch_s, "kv_bytes": runs["kv"][-1][2].kv_bytes,
           "step_s": statistics.median(r[1] for r in runs["kv"])}
    for way, results in runs.items():
        row[f"{way}_s"] = statistics.median(r[0] for r in results)
        row[f"{way}_phases"] = [statistics.median(getattr(r[2], p) for r in results) for p in PHASES]
        row[f"{way}_first_s"] = statistics.median(r[0] - r[2].total_s for r in results)
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
    states = many[:samples]
    blocks = -(-tokens // layout.block_size)
    cache = torch.randn(layout.cache_shape(samples * blocks + 1)).to(layout.torch_dtype)
    perm = torch.randperm(samples * blocks, generator=torch.Generator().manual_seed(0))
    tables = [perm[i * blocks:(i + 1) * blocks].tolist() for i in range(samples)]  # scattered blocks
    counts = [tokens] * samples
    out = torch.zeros(samples * tokens * layout.token_bytes, dtype=torch.uint8)
    kv = gather_pages_batch(cache, layout, tables, counts, out=out)
    batch = MigrationBatch(states=tuple(states), kv_layout=layout, kv_tokens=tuple(counts), kv_data=kv)
    packed = pack_batch(batch)
    writable = bytearray(packed)
    with TransferChannel(TransferConfig(relay=False, transport=transport)) as channel:
        rows = [("states pack (64 samples)", len(packed_states), best(lambda: pack_states(many), reps)),
                ("states unpack (64 samples)", len(packed_states), best(lambda: unpack_states(packed_states), reps)),
                ("batch pack (with KV)", len(packed), best(lambda: pack_batch(batch), reps)),
                ("batch unpack (read-only bytes)", len(packed), best(lambda: unpack_batch(packed), reps)),
                ("batch unpack (writable: zero-copy)", len(packed), best(lambda: unpack_batch(writable), reps)),
                ("in-process ship + unpack", len(packed),
                 best(lambda: unpack_batch(InProcessChannel().ship(packed)), reps)),
                (f"transfer ship ({transport}: publish+pull)", len(packed),
                 best(lambda: channel.ship(packed), reps)),
                ("KV gather (paged -> bytes)", out.numel(),
                 best(lambda: gather_pages_batch(cache, layout, tables, counts, out=out), reps)),
                ("KV scatter (bytes -> paged)", out.numel(),
                 best(lambda: scatter_pages_batch(cache, layout, tables, counts, kv), reps))]
    return [(path, n, s, memcpy_s(n, reps)) for path, n, s in rows]


def fmt_ms(s: float | None) -> str:
    return f"{s * 1e3:10.1f}" if s is not None else f"{'-':>10}"


def print_tables(rows: list[dict], codec: list, args) -> None:
    print(f"Resume one sample on another engine: ms until the destination's next token (fp32 CPU, "
          f"{args.threads} thread(s), switch interval {sys.getswitchinterval() * 1e3:g} ms, prompt {PROMPT} "
          f"+ prefix, median of {args.hops} hops; transfer = {args.transport})")
    print(f"{'model':<10} {'prefix':>6} {'scratch':>10} {'reprefill':>10} {'kv':>10} {'kv/transfer':>11} "
          f"{'kv x':>6} {'ceiling x':>9} {'KV MB':>7}")
    for r in rows:
        print(f"{r['model']:<10} {r['prefix']:>6} {fmt_ms(r['scratch_s'])} {fmt_ms(r['tokens_s'])} "
              f"{fmt_ms(r['kv_s'])} {fmt_ms(r['kv_transfer_s']):>11} {r['tokens_s'] / r['kv_s']:6.1f} "
              f"{r['ceiling']:9.1f} {r['kv_bytes'] / 1e6:7.2f}")
    print()
    print("Phases (ms, medians): drain = export, incl. waiting for the source's step in flight; "
          "resume = import; first = import returned -> next token; step = the decode step after it")
    print(f"{'model':<10} {'prefix':>6} {'way':<12} {'drain':>7} {'pack':>7} {'ship':>7} {'unpack':>7} "
          f"{'resume':>7} {'first':>7} {'step':>7}")
    for r in rows:
        for way in WAYS:
            phases = [p * 1e3 for p in r[f"{way}_phases"]]
            first = r[f"{way}_first_s"] * 1e3
            print(f"{r['model']:<10} {r['prefix']:>6} {way:<12} " + " ".join(f"{p:7.2f}" for p in phases)
                  + f" {first:7.2f} {r['step_s'] * 1e3:7.2f}")
    print()
    print(f"{'codec / copy path':<40} {'MB':>8} {'GB/s':>7} {'memcpy GB/s':>12} {'of memcpy':>10}")
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
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--transport", default="auto", help="transfer transport (auto: shm on one host)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval in ms (Python's default: 5)")
    parser.add_argument("--quick", action="store_true", help="tiny model, short prefixes, few hops")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.hops, args.no_big = [64, 256], 2, True
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1e3)
    with tempfile.TemporaryDirectory() as root:
        rows = measure_model("tiny", root, args)
        if not args.no_big:
            rows += measure_model("qwen3-54m", root, args)
    codec_layout = KVLayout(num_layers=12, num_kv_heads=4, head_dim=64, block_size=16, dtype="float32")
    codec = codec_rates(codec_layout, samples=4, tokens=256 if args.quick else 2048, reps=3 if args.quick else 5,
                        transport=args.transport)
    copy_rate = max(n / mem for _, n, _, mem in codec)
    for r in rows:
        r["ceiling"] = r["tokens_s"] / (r["step_s"] + r["kv_bytes"] / copy_rate)
    print_tables(rows, codec, args)
    tiny_lengths = [r["prefix"] for r in rows if r["model"] == "tiny"]
    key = 2048 if 2048 in tiny_lengths else max(tiny_lengths)
    head = next(r for r in rows if r["model"] == "tiny" and r["prefix"] == key)
    peers = {f"reprefill_ms_{key}": head["tokens_s"] * 1e3, f"kv_ms_{key}": head["kv_s"] * 1e3,
             f"kv_transfer_ms_{key}": head["kv_transfer_s"] * 1e3}
    if head["scratch_s"] is not None:
        peers[f"scratch_ms_{key}"] = head["scratch_s"] * 1e3
    for r in rows:
        if r["model"] != "tiny" and r["prefix"] == key:
            peers[f"{r['model']}_kv_resume_speedup_{key}"] = r["tokens_s"] / r["kv_s"]
    peers.update({f"{path.split(' (')[0].replace(' ', '_')}_gbps": n / s / 1e9 for path, n, s, _ in codec[:4]})
    print(json.dumps({"metric": f"kv_resume_speedup_{key}", "value": head["tokens_s"] / head["kv_s"],
                      "unit": "x (re-prefill time / KV resume time, tiny model)", "ceiling": head["ceiling"],
                      "peers": peers, "date": datetime.date.today().isoformat()}))


if __name__ == "__main__":
    main()
