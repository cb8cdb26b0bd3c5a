"""Trainer memory and packing on CPU, one process: (1) the activations a forward keeps for
backward with and without activation checkpointing; (2) the measured peak of a whole
training step in a run's steady state (every micro-batch of the batch under the token
budget, forward and backward, then the clipped AdamW step, after one step that made
AdamW's moments; torch's CPU allocator as its profiler counts it) against the memory
plan's peak (rlboost.trainer.memory) for three configs; (3) packed against
padded tokens/s for a batch whose response lengths follow the paper's long tail
(rollout.emulated.lengths, log-normal, scaled to CPU size). Ends with one JSON line.

    python bench/trainer_memory.py [--scale 16] [--samples 16]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.emulated.lengths import LengthConfig
from rlboost.trainer.batch import ScoredSample, build_micro_batch, micro_batch_loss
from rlboost.trainer.fsdp import build_optimizer, optimizer_step
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.memory import ModelDims, plan_trainer_memory
from rlboost.trainer.split import split_for_ranks

VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV, HEAD_DIM = 2048, 128, 384, 4, 4, 2, 32
DIMS = ModelDims("bench-qwen3", VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV, HEAD_DIM, tied=True, qk_norm=True)
GRPO = GRPOConfig()


def _model(root: str, checkpointing: bool):
    path = os.path.join(root, "ckpt")
    if not os.path.isdir(path):
        build_tiny_checkpoint(path, arch="qwen3", seed=0, vocab_size=VOCAB, hidden_size=HIDDEN,
                              intermediate_size=INTER, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV,
                              head_dim=HEAD_DIM)
    model = load_pretrained(path)
    model.activation_checkpointing = checkpointing
    return model


def _samples(lengths: list[int], prompt: int = 16) -> list[ScoredSample]:
    g = torch.Generator().manual_seed(0)
    return [ScoredSample(sample_id=i, group_id=i // 4, prompt_ids=tuple(torch.randint(1, VOCAB, (prompt,), generator=g).tolist()),
                         output_ids=tuple(torch.randint(1, VOCAB, (n,), generator=g).tolist()),
                         output_logprobs=(-7.0,) * n, reward=float(i % 3)) for i, n in enumerate(lengths)]


def saved_activation_bytes(model, batch) -> int:
    """Bytes of the distinct storages autograd keeps for backward during one forward."""
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = micro_batch_loss(model, batch, GRPO, denominator=1.0).loss
    loss.backward()
    return sum(n for ptr, n in seen.items() if ptr not in params)


def _train_step(model, opt, parts) -> None:
    """What a rank does in a step: forward and backward of each micro-batch, then optimizer_step."""
    for part in parts:
        micro_batch_loss(model, part, GRPO, denominator=1.0).loss.backward()
    optimizer_step(model, opt)


def measured_step_peak(model, parts) -> float:
    """Peak bytes of one steady-state training step: what is alive when it starts (the
    parameters and AdamW's moments, which a first step made) plus the CPU allocator's peak
    above that while the step runs (torch.profiler's memory events, "Total Allocated").

    The profiler's running total is the process's, not the profile's: blocks allocated in
    an earlier profile and freed outside one are never subtracted, so the peak is taken
    above the total this profile starts from."""
    opt = build_optimizer(model)
    _train_step(model, opt, parts)
    alive = sum(t.numel() * t.element_size() for t in [*model.parameters(), *(
        v for state in opt.state.values() for v in state.values() if torch.is_tensor(v))])
    path = tempfile.mktemp(suffix=".json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        _train_step(model, opt, parts)
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = sorted((e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"),
                        key=lambda e: e["ts"])
    os.unlink(path)
    start = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    return alive + max(e["args"]["Total Allocated"] for e in events) - start


def _tokens_per_s(model, batch, packed: bool, repeats: int = 2) -> float:
    part = split_for_ranks(batch, 1, packed=packed)[0][0]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        micro_batch_loss(model, part, GRPO, denominator=1.0).loss.backward()
        best = min(best, time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return batch.num_response_tokens / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=16.0, help="divide the paper's lengths by this (CPU size)")
    ap.add_argument("--samples", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    root = tempfile.mkdtemp()
    lengths_cfg = LengthConfig(kind="lognormal")
    cap = int(14336 / args.scale)
    import random
    from statistics import NormalDist
    rnd = random.Random(0)
    lengths = [max(1, min(cap, int(lengths_cfg.median_tokens / args.scale
                                   * pow(2.718281828, lengths_cfg.sigma * NormalDist().inv_cdf(rnd.random())))))
               for _ in range(args.samples)]
    batch = build_micro_batch(_samples(lengths), pad_id=0, config=GRPO)
    print(f"batch: {args.samples} samples, responses {min(lengths)}-{max(lengths)} tokens (paper's log-normal / "
          f"{args.scale:g}), {sum(lengths) + 16 * len(lengths)} real tokens, {batch.input_ids.numel()} padded")

    # (1) activations kept for backward, packed forward of the whole batch
    packed = split_for_ranks(batch, 1, packed=True)[0][0]
    act = {ck: saved_activation_bytes(_model(root, ck), packed) for ck in (False, True)}
    print(f"activations kept: {act[False] / 1e6:.1f} MB without checkpointing, {act[True] / 1e6:.1f} MB with "
          f"({act[False] / act[True]:.2f}x less)")

    # (2) plan against measured step peaks, three configs
    rows = []
    for ck, budget in ((False, 2048), (True, 2048), (True, 4096)):
        parts = [p for p in split_for_ranks(batch, 1, max_tokens=budget, packed=True)[0] if p.num_tokens]
        tokens = max(p.num_tokens for p in parts)
        measured = measured_step_peak(_model(root, ck), parts)
        plan = plan_trainer_memory(DIMS, world_size=1, tokens=tokens, compute_bytes=4, checkpointing=ck,
                                   offload=False, gathered_copies=False, micro_batches=len(parts))
        rows.append({"checkpointing": ck, "budget": budget, "micro_batches": len(parts), "tokens": tokens,
                     "plan_mb": plan.total_bytes / 1e6, "plan_phase": plan.peak_phase,
                     "measured_mb": measured / 1e6, "ratio": plan.total_bytes / measured})
        print(f"step peak, checkpointing {'on ' if ck else 'off'} budget {budget} ({len(parts)} micro-batches, "
              f"largest {tokens} tokens): plan {plan.total_bytes / 1e6:.1f} MB ({plan.peak_phase}), "
              f"measured {measured / 1e6:.1f} MB (plan / measured {rows[-1]['ratio']:.3f})")

    # (3) packed against padded tokens/s
    model = _model(root, False)
    rate = {p: _tokens_per_s(model, batch, p) for p in (True, False)}
    speedup = rate[True] / rate[False]
    print(f"train tokens/s (forward + backward): packed {rate[True]:.0f}, padded {rate[False]:.0f} ({speedup:.2f}x); "
          f"ceiling: padded tokens / real tokens = {batch.input_ids.numel() / int(batch.attention_mask.sum()):.2f}x")
    print(json.dumps({"metric": "packed_vs_padded_tokens_per_s", "value": round(speedup, 3), "unit": "x",
                      "ceiling": round(batch.input_ids.numel() / int(batch.attention_mask.sum()), 3),
                      "peers": {"packed_tokens_per_s": round(rate[True]), "padded_tokens_per_s": round(rate[False]),
                                "activation_mb": {"off": round(act[False] / 1e6, 1), "on": round(act[True] / 1e6, 1)},
                                "plan_vs_measured": rows}}))


if __name__ == "__main__":
    main()
