"""Decode tokens/s of the embedded engine on a tiny checkpoint, at batch 1 and 16.

Ceiling: the engine's own paged forward + sampling called in a bare loop (no scheduler,
thread or streaming). Peers: vLLM through rlboost's adapter (the path a run takes; its CPU
build here, when installed), a dense DecoderLM forward that re-reads the whole sequence
each step (no KV cache), and transformers' generate() with its KV cache when installed.
The checkpoint's heads are 32 wide, the narrowest vLLM's CPU attention takes.
Usage: python bench/embedded_decode.py [--tokens 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from rlboost.migration.state import RequestState, SamplingParams
from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.rollout.embedded.forward import Chunk, PagedForward
from rlboost.rollout.embedded.kv_cache import PagedKVCache
from rlboost.rollout.embedded.sampling import DrawSpec, draw_key, sample_tokens


def prompts(batch: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 259, (16,), generator=gen).tolist() for _ in range(batch)]


def streamed_rate(engine, batch: int, tokens: int) -> float:
    """Decode tokens/s of a RolloutEngine over one batch, after a warm-up batch."""
    def run(offset: int) -> float:
        states = [RequestState(sample_id=offset + i, prompt_ids=tuple(p), seed=0, weight_version=0,
                               params=SamplingParams(temperature=1.0, max_new_tokens=tokens))
                  for i, p in enumerate(prompts(batch))]
        start = time.perf_counter()
        engine.submit(states)
        done = 0
        while done < batch:
            done += sum(d.finish_reason is not None for d in engine.poll(10.0))
        return batch * tokens / (time.perf_counter() - start)
    run(10_000 * batch)  # warm-up
    return run(10_000 * batch + 1000)


def engine_rate(ckpt, batch: int, tokens: int) -> float:
    with EmbeddedEngine(EmbeddedEngineConfig(model_dir=ckpt, stream_interval=32)) as engine:
        return streamed_rate(engine, batch, tokens)


def vllm_rates(ckpt, batches: tuple[int, ...], tokens: int, threads: int) -> dict[int, float | None]:
    """vLLM's decode rate through rlboost's adapter, one engine for every batch (None each
    when vLLM is not installed). vLLM's own log goes to stderr, warnings only, so that stdout
    holds the table."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        from vllm.platforms import current_platform

        from rlboost.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig
    except ImportError:
        return dict.fromkeys(batches)
    config = VLLMEngineConfig(model_path=ckpt, dtype="float32", device=str(current_platform.device_type),
                              stream_interval=32, kv_cache_bytes=256 << 20, cpu_threads=threads, weight_version=0)
    with VLLMEngine(config) as engine:
        return {batch: streamed_rate(engine, batch, tokens) for batch in batches}


def ceiling_rate(ckpt, batch: int, tokens: int) -> float:
    model = load_pretrained(ckpt).requires_grad_(False)
    c = model.config
    cache = PagedKVCache(num_layers=c.num_hidden_layers, num_kv_heads=c.num_key_value_heads,
                         head_dim=c.head_dim, num_blocks=batch * 16, block_size=16,
                         dtype=torch.float32, device=torch.device("cpu"))
    forward = PagedForward(model, cache)
    seqs = prompts(batch)
    blocks = [cache.allocator.allocate(16) for _ in seqs]
    chunks = [Chunk(list(s), 0, b, True) for s, b in zip(seqs, blocks)]
    start = time.perf_counter()
    for t in range(tokens):
        specs = [DrawSpec(1.0, 0, 1.0, draw_key(0, i, t)) for i in range(batch)]
        ids, _ = sample_tokens(forward(chunks), specs)
        for s, tok in zip(seqs, ids):
            s.append(tok)
        chunks = [Chunk([s[-1]], len(s) - 1, b, True) for s, b in zip(seqs, blocks)]
    return batch * tokens / (time.perf_counter() - start)


@torch.no_grad()
def dense_rate(ckpt, batch: int, tokens: int) -> float:
    model = load_pretrained(ckpt)
    ids = torch.tensor(prompts(batch))
    start = time.perf_counter()
    for _ in range(tokens):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return batch * tokens / (time.perf_counter() - start)


@torch.no_grad()
def hf_rate(ckpt, batch: int, tokens: int) -> float | None:
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    ids = torch.tensor(prompts(batch))
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return batch * tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = (1, 16)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(build_tiny_checkpoint(tmp, arch="qwen3", seed=0, head_dim=32))
        vllm = vllm_rates(ckpt, batches, args.tokens, args.threads)
        rows = {}
        for batch in batches:
            rows[batch] = {"engine": engine_rate(ckpt, batch, args.tokens),
                           "ceiling": ceiling_rate(ckpt, batch, args.tokens),
                           "vllm": vllm[batch],
                           "dense_no_cache": dense_rate(ckpt, batch, args.tokens),
                           "hf_generate": hf_rate(ckpt, batch, args.tokens)}
    print(f"tiny qwen3 (2 layers, hidden 64, 4 heads of 32, vocab 320), fp32, measured on this CPU, "
          f"{args.threads} thread(s), {args.tokens} new tokens after a 16-token prompt; decode tokens/s")
    print(f"{'batch':>5} {'engine':>10} {'ceiling':>10} {'vllm':>10} {'dense':>10} {'hf':>10}")
    for batch, r in rows.items():
        cells = [f"{r[k]:10.0f}" if r[k] else f"{'n/a':>10}" for k in ("vllm", "dense_no_cache", "hf_generate")]
        print(f"{batch:>5} {r['engine']:10.0f} {r['ceiling']:10.0f} {' '.join(cells)}")
    peers = {"dense_no_cache_b16": rows[16]["dense_no_cache"], "engine_b1": rows[1]["engine"]}
    for name in ("vllm", "hf_generate"):
        for batch in batches:
            if rows[batch][name]:
                peers[f"{name}_b{batch}"] = rows[batch][name]
    print(json.dumps({"metric": "embedded_decode_tokens_per_s_b16", "value": rows[16]["engine"],
                      "unit": "tokens/s", "ceiling": rows[16]["ceiling"], "peers": peers}))


if __name__ == "__main__":
    main()
