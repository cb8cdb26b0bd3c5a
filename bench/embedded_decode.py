"""Decode tokens/s of the embedded engine on a tiny checkpoint, at batch 1 and 16.

Ceiling: the engine's own paged forward + sampling called in a bare loop (no scheduler,
thread or streaming). Peers: a dense DecoderLM forward that re-reads the whole sequence
each step (no KV cache), and transformers' generate() with its KV cache when installed.
Usage: python bench/embedded_decode.py [--tokens 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
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


def engine_rate(ckpt, batch: int, tokens: int) -> float:
    with EmbeddedEngine(EmbeddedEngineConfig(model_dir=ckpt, stream_interval=32)) as engine:
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
        run(0)  # warm-up
        return run(1000)


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
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(build_tiny_checkpoint(tmp, arch="qwen3", seed=0))
        rows = {}
        for batch in (1, 16):
            rows[batch] = {"engine": engine_rate(ckpt, batch, args.tokens),
                           "ceiling": ceiling_rate(ckpt, batch, args.tokens),
                           "dense_no_cache": dense_rate(ckpt, batch, args.tokens),
                           "hf_generate": hf_rate(ckpt, batch, args.tokens)}
    print(f"tiny qwen3 (2 layers, hidden 64, vocab 320), fp32 CPU, {args.threads} thread(s), "
          f"{args.tokens} new tokens after a 16-token prompt; decode tokens/s")
    print(f"{'batch':>5} {'engine':>10} {'ceiling':>10} {'dense':>10} {'hf':>10}")
    for batch, r in rows.items():
        hf = f"{r['hf_generate']:10.0f}" if r["hf_generate"] else f"{'n/a':>10}"
        print(f"{batch:>5} {r['engine']:10.0f} {r['ceiling']:10.0f} {r['dense_no_cache']:10.0f} {hf}")
    peers = {"dense_no_cache_b16": rows[16]["dense_no_cache"], "engine_b1": rows[1]["engine"]}
    if rows[16]["hf_generate"]:
        peers["hf_generate_b16"] = rows[16]["hf_generate"]
    print(json.dumps({"metric": "embedded_decode_tokens_per_s_b16", "value": rows[16]["engine"],
                      "unit": "tokens/s", "ceiling": rows[16]["ceiling"], "peers": peers}))


if __name__ == "__main__":
    main()
