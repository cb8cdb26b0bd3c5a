"""Peak memory of GRPO's token log-probs, forward and backward, from bf16 logits at Qwen3's
vocabulary: rlboost's chunked token_logprobs against the naive float32 upcast of [B, T, V].

What the trainer computes: FSDP2 with param_dtype=bfloat16 runs lm_head over every position,
so the log-probs start from bf16 logits [B, T, V]; their gradient flows back as [B, T, V].
At B x T = 8 x 2048 and V = 151,936 the naive path needs more memory than this machine has,
so the peak is counted, exactly, as the bytes of every tensor storage alive at once while
the real code runs on fake tensors (torch's FakeTensorMode: shapes and dtypes, no data).
The same counter on real tensors at B = 1, beside the process's peak RSS, shows that the
count matches what the process holds. Floor: the logits plus their gradient, which any
method starting from materialised logits holds at the end of backward.
With --device cuda the peaks are also measured on the GPU (torch.cuda.max_memory_allocated,
real tensors at the full size), which is what bench/gpu_check.sh runs.
Usage: python bench/logprob_memory.py [--batch 8] [--length 2048] [--vocab 151936] [--check-batch 1]
                                      [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from rlboost.trainer.grpo import token_logprobs

GB = 1e9


def naive_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The upcast rlboost used before: float32 [B, T - 1, V], then gather - logsumexp."""
    pred = logits[:, :-1, :].float()
    picked = pred.gather(-1, input_ids[:, 1:].long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(pred, dim=-1)
    return torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)


METHODS = {"chunked": lambda logits, ids: token_logprobs(logits, ids), "naive": naive_logprobs}


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of tensor storage alive after every op, and their peak: each storage counted once
    (views share it), from the op that made it until its last tensor is gone."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage._cdata not in self.live:
            self.live[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)

    def sweep(self) -> None:
        for key, (ref, nbytes) in list(self.live.items()):
            if ref.expired():
                del self.live[key]
                self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sweep()  # what died before this op; its inputs and outputs coexist
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.add(t)
        return out


def step(method: str, logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, meter: LiveTensorBytes):
    """One log-prob forward and backward, with the per-token gradient a GRPO loss hands back."""
    meter.add(logits)
    logits.requires_grad_(True)
    with meter:
        out = torch.where(mask, METHODS[method](logits, ids), 0.0)
        out.backward(torch.full_like(out, 1e-3))
        meter.sweep()
    return meter


def counted_on_fake_tensors(method: str, batch: int, length: int, vocab: int) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        logits = torch.empty(batch, length, vocab, dtype=torch.bfloat16)
        ids = torch.zeros(batch, length, dtype=torch.long)
        mask = torch.ones(batch, length, dtype=torch.bool)
        return step(method, logits, ids, mask, LiveTensorBytes()).peak


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def child(method: str, batch: int, length: int, vocab: int) -> None:
    """Real tensors: the counted peak and the process's peak RSS over the step."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, length, vocab, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.bool)
    before = _rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak RSS, to the current RSS
    meter = step(method, logits, ids, mask, LiveTensorBytes())
    extra_rss = _rss("VmHWM") - before
    print(json.dumps({"counted": meter.peak, "rss": extra_rss + logits.untyped_storage().nbytes()}))


def measured_on_real_tensors(method: str, batch: int, length: int, vocab: int) -> dict:
    cmd = [sys.executable, __file__, "--child", method, "--batch", str(batch), "--length", str(length),
           "--vocab", str(vocab)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def measured_on_cuda(method: str, batch: int, length: int, vocab: int) -> int:
    """Peak bytes the CUDA caching allocator handed out over the step, logits included."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(batch, length, vocab, generator=gen, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, vocab, (batch, length), generator=gen, device="cuda")
    mask = torch.ones(batch, length, dtype=torch.bool, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    logits.requires_grad_(True)
    out = torch.where(mask, METHODS[method](logits, ids), 0.0)
    out.backward(torch.full_like(out, 1e-3))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del logits, ids, mask, out
    torch.cuda.empty_cache()
    return peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--check-batch", type=int, default=1, help="B of the real-tensor check (0: skip)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--child", choices=sorted(METHODS), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child, a.batch, a.length, a.vocab)
        return
    B, T, V = a.batch, a.length, a.vocab
    floor = 2 * B * T * V * 2  # bf16 logits and their bf16 gradient
    peak = {m: counted_on_fake_tensors(m, B, T, V) for m in METHODS}
    print(f"token log-probs, forward + backward, from bf16 logits [B={B}, T={T}, V={V}]")
    print("peak bytes of live tensors, counted on fake tensors")
    print(f"{'':32}{'peak GB':>10}{'x floor':>10}")
    print(f"{'floor: logits + their gradient':32}{floor / GB:10.2f}{1.0:10.2f}")
    for name, label in (("chunked", "rlboost token_logprobs"), ("naive", "peer: naive float32 upcast")):
        print(f"{label:32}{peak[name] / GB:10.2f}{peak[name] / floor:10.2f}")
    ratio = peak["naive"] / peak["chunked"]
    print(f"naive / chunked peak: {ratio:.2f}x")
    check = {}
    if a.device == "cuda":
        gpu = {m: measured_on_cuda(m, B, T, V) for m in METHODS}
        print(f"on {torch.cuda.get_device_name()}: torch.cuda.max_memory_allocated over the step")
        for name in METHODS:
            print(f"  {name:10} {gpu[name] / GB:6.2f} GB")
        print(f"  naive / chunked: {gpu['naive'] / gpu['chunked']:.2f}x")
        check["cuda"] = gpu
    elif a.check_batch:
        print(f"check on real tensors [B={a.check_batch}, T={T}, V={V}]: counted peak vs process peak RSS")
        for name in METHODS:
            check[name] = measured_on_real_tensors(name, a.check_batch, T, V)
            print(f"  {name:10} counted {check[name]['counted'] / GB:6.2f} GB   "
                  f"RSS {check[name]['rss'] / GB:6.2f} GB")
    final = check.get("cuda", peak)  # on a GPU, what its allocator measured
    print(json.dumps({"metric": f"logprob_peak_memory_{a.device}", "value": round(final["chunked"] / GB, 3),
                      "unit": "GB", "ceiling": round(floor / GB, 3),
                      "peers": {"naive_fp32_upcast": round(final["naive"] / GB, 3)},
                      "reduction_vs_naive": round(final["naive"] / final["chunked"], 2), "shape": [B, T, V],
                      "measured": {k: {f: round(v / GB, 3) for f, v in d.items()} for k, d in check.items()}}))


if __name__ == "__main__":
    main()
