"""The timing model: how long a named model takes on named accelerators to decode, prefill,
train and publish its weights, from rooflines run at one efficiency fitted once (EFFICIENCY).

Emulated engines, the emulated trainer and the simulator all take their durations from here,
so an emulated run and a simulated one describe the same cluster. Every figure in the
tables names its source; the only fitted number is EFFICIENCY (see its note).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One GPU: peak HBM bandwidth, dense bf16 FLOP/s, memory, host link (per direction)."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops: float
    memory_bytes: float
    host_bytes_per_s: float
    source: str


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder's shape: what its rooflines need (bf16 weights and KV cache by default)."""

    name: str
    params: float
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    source: str
    dtype_bytes: int = 2
    embedding_params: float = 0.0
    """the input embedding's parameters when it is not tied to the LM head: a lookup of one
    row per token, so neither FLOPs nor a read of the whole matrix per step"""

    @property
    def weight_bytes(self) -> float:
        """Every parameter (what memory holds and a weight transfer moves)."""
        return self.params * self.dtype_bytes

    @property
    def matmul_params(self) -> float:
        """Parameters every token multiplies through (all but an untied input embedding)."""
        return self.params - self.embedding_params

    @property
    def step_weight_bytes(self) -> float:
        """Bytes of weights one forward step reads (the embedding rows it looks up are negligible)."""
        return self.matmul_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer: 2 * layers * kv_heads * head_dim * dtype bytes."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one query token against one cached token, all layers (QK^T and AV)."""
        return 4.0 * self.layers * self.q_heads * self.head_dim


ACCELERATORS = {
    "h100-sxm": Accelerator("h100-sxm", 3.35e12, 989e12, 80e9, 64e9,
                            "NVIDIA H100 Tensor Core GPU datasheet, SXM5: 3.35 TB/s HBM3, 989 TFLOP/s dense "
                            "BF16, 80 GB; host link PCIe Gen5 x16, 64 GB/s per direction"),
    "h200": Accelerator("h200", 4.8e12, 989e12, 141e9, 64e9,
                        "NVIDIA H200 datasheet, SXM: 4.8 TB/s HBM3e, 989 TFLOP/s dense BF16, 141 GB; PCIe Gen5 x16"),
    "a100-sxm-80gb": Accelerator("a100-sxm-80gb", 2.039e12, 312e12, 80e9, 32e9,
                                 "NVIDIA A100 datasheet, SXM 80GB: 2,039 GB/s HBM2e, 312 TFLOP/s dense BF16; "
                                 "PCIe Gen4 x16, 32 GB/s per direction"),
}

MODELS = {
    "qwen3-8b": ModelShape("qwen3-8b", 8.2e9, 36, 4096, 32, 8, 128,
                           "Qwen/Qwen3-8B config.json (36 layers, hidden 4096, 32 query / 8 KV heads, "
                           "head_dim 128, vocabulary 151,936, tie_word_embeddings false) and model card "
                           "(8.2B parameters): 16.4 GB in bf16, 147,456 KV bytes per token; the untied input "
                           "embedding (151,936 x 4,096 = 0.62B) is a lookup",
                           embedding_params=151_936 * 4_096),
    "qwen3-1.7b": ModelShape("qwen3-1.7b", 1.7e9, 28, 2048, 16, 8, 128,
                             "Qwen/Qwen3-1.7B config.json (28 layers, hidden 2048, 16 query / 8 KV heads, "
                             "head_dim 128, tie_word_embeddings true: the one matrix is also the LM head's "
                             "matmul) and model card (1.7B parameters)"),
}

# The one fitted number: the share of peak (HBM bandwidth, FLOP/s, host link) every roofline
# below reaches. Fitted once so that the RLBoost artifact's baseline holds: verl's synchronous
# colocated trainer, Qwen3-8B GRPO on one 8x H100 node, 128 prompts x 8 samples, about 1,300
# tokens/s per GPU x 8 = 10,400 tokens/s of prompt + response (Terra-Flux/PolyRL REPRODUCE.md).
# `rlboost simulate --calibrate` re-derives it by bisection on the simulator's reserved-only
# run of the paper recipe; everything else is a prediction, the artifact's own 1-4 worker
# curve included (it comes out at 0.63-0.85 of what the artifact measured: README, limitations).
EFFICIENCY = 0.441

# Forward-pass equivalents per trained token in a GRPO step as verl runs it: old log-probs (1),
# reference log-probs for the KL loss (1), the actor's forward (1) and backward (2), and the
# forward again under activation checkpointing (1).
TRAIN_FORWARD_PASSES = 6

# Seconds from a spot request to a VM able to run the engine (Bamboo's simulator uses 45 s of
# instance creation, uclasystem/bamboo project_pactum/simulation), and an estimate of the
# engine's own start (server, CUDA graph capture) before its first weight pull.
INSTANCE_CREATE_S = 45.0
ENGINE_WARMUP_S = 30.0

# Network: the artifact asks for 200 Gbps of egress on the trainer host (REPRODUCE.md);
# each preemptible instance is assumed to reach the same per flow.
LINK_BYTES_PER_S = 25e9

# Preemption notices: AWS gives 2 minutes, GCP spot VMs 30 s (anchors, section C).
AWS_NOTICE_S = 120.0
GCP_NOTICE_S = 30.0


def accelerator(name: str) -> Accelerator:
    if name not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {sorted(ACCELERATORS)}, got {name!r}")
    return ACCELERATORS[name]


def model_shape(name: str) -> ModelShape:
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name]


@dataclass(frozen=True, slots=True)
class GpuTiming:
    """Durations of one engine (or trainer) of `gpus` accelerators running `model`.

    >>> t = GpuTiming(model_shape("qwen3-8b"), accelerator("h100-sxm"), gpus=2, efficiency=1.0)
    >>> round(t.decode_step_s(batch=1, context=0) * 1e3, 2)  # 15.2 GB (no embedding) over 2 x 3.35 TB/s
    2.26

    A decode step reads the weights (less the embedding it only looks up) and the whole KV
    cache of the batch (memory roofline) and does 2 x matmul params FLOPs per sample plus
    attention over the cached tokens (compute
    roofline); it takes the longer of the two, at `efficiency` of peak. Tensor parallelism
    splits both over the GPUs (its communication is in the efficiency).
    """

    model: ModelShape
    accelerator: Accelerator
    gpus: int
    efficiency: float = EFFICIENCY
    # the decode lines' coefficients, computed once (engines ask for them at every event)
    _lines: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {self.gpus}")
        if not 0.0 < self.efficiency <= 1.0:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
        m, bw, flops = self.model, self._bw, self._flops
        object.__setattr__(self, "_lines", (m.step_weight_bytes / bw, m.kv_bytes_per_token / bw,
                                            2.0 * m.matmul_params / flops, m.attention_flops_per_pair / flops))

    @property
    def _bw(self) -> float:
        return self.gpus * self.accelerator.hbm_bytes_per_s * self.efficiency

    @property
    def _flops(self) -> float:
        return self.gpus * self.accelerator.bf16_flops * self.efficiency

    # -- decode --------------------------------------------------------------------------

    def decode_lines(self, batch: int) -> tuple[tuple[float, float], tuple[float, float]]:
        """(intercept, slope) of the step time against the batch's cached tokens, for the
        memory and the compute roofline."""
        mem_a, mem_b, cmp_a, cmp_b = self._lines
        return (mem_a, mem_b), (cmp_a * batch, cmp_b)

    def decode_step_s(self, batch: int, context: float) -> float:
        """One decode step of `batch` samples holding `context` cached tokens in all."""
        (a1, b1), (a2, b2) = self.decode_lines(batch)
        return max(a1 + b1 * context, a2 + b2 * context)

    def decode_time_s(self, batch: int, context: float, steps: float) -> float:
        """Seconds for `steps` decode steps starting at `context` cached tokens; each step
        adds `batch` tokens to the cache (steps may be fractional)."""
        if steps <= 0 or batch <= 0:
            return 0.0
        total, x = 0.0, 0.0
        for a, b, end in self._pieces(batch, context, steps):
            total += a * (end - x) + b * (end * end - x * x) / 2.0
            x = end
        return total

    def decode_steps_in(self, batch: int, context: float, seconds: float) -> float:
        """How many decode steps fit in `seconds` from `context` (the inverse of decode_time_s)."""
        if seconds <= 0 or batch <= 0:
            return 0.0
        left, x = seconds, 0.0
        for a, b, end in self._pieces(batch, context, math.inf):
            span = a * (end - x) + b * (end * end - x * x) / 2.0 if end < math.inf else math.inf
            if span >= left:  # solve a (n - x) + b (n^2 - x^2) / 2 = left for n
                c = left + a * x + b * x * x / 2.0
                return (-a + math.sqrt(a * a + 2.0 * b * c)) / b if b > 0 else x + left / a
            left -= span
            x = end
        return x

    def _pieces(self, batch: int, context: float, steps: float) -> tuple:
        """The step time as (a, b, end): t(x) = a + b x for x (steps done) up to end, where
        the binding roofline switches at most once (both lines grow with the cache)."""
        a1, b1, a2, b2 = self._lines
        a2 *= batch
        # in steps x: t = a + b (context + batch x)
        ma, mb = a1 + b1 * context, b1 * batch
        ca, cb = a2 + b2 * context, b2 * batch
        if ma >= ca:
            if cb > mb and (cross := (ma - ca) / (cb - mb)) < steps:
                return ((ma, mb, cross), (ca, cb, steps))
            return ((ma, mb, steps),)
        if mb > cb and (cross := (ca - ma) / (mb - cb)) < steps:
            return ((ca, cb, cross), (ma, mb, steps))
        return ((ca, cb, steps),)

    # -- prefill and training ----------------------------------------------------------------

    def prefill_s(self, tokens: float, past: float = 0.0) -> float:
        """Prefill `tokens` after `past` cached ones (a resumed sample) on its own: compute-bound
        at 2 x matmul params per token plus causal attention, or the weights' read, whichever is longer."""
        if tokens <= 0:
            return 0.0
        return max(self.prefill_compute_s(tokens, past), self.weights_read_s())

    def prefill_compute_s(self, tokens: float, past: float = 0.0) -> float:
        """The compute part of a prefill (a batch of prompts adds these, and reads the weights once)."""
        m = self.model
        return (2.0 * m.matmul_params * tokens + m.attention_flops_per_pair * tokens * (past + tokens / 2.0)) / self._flops

    def weights_read_s(self) -> float:
        """One pass over the weights at the memory roofline (a step's floor)."""
        return self.model.step_weight_bytes / self._bw

    def train_s(self, sequences: float, tokens: float, squared_tokens: float) -> float:
        """One GRPO pass over `sequences` of `tokens` in all (prompt + response) whose squared
        lengths sum to `squared_tokens`: TRAIN_FORWARD_PASSES forward equivalents, each
        2 x matmul params per token plus causal attention (half the square of each length)."""
        if tokens <= 0:
            return 0.0
        m = self.model
        forward = 2.0 * m.matmul_params * tokens + m.attention_flops_per_pair * squared_tokens / 2.0
        return TRAIN_FORWARD_PASSES * forward / self._flops

    def optimizer_s(self) -> float:
        """An Adam step: fp32 master weights, gradients and two moments read and written."""
        return 2.0 * 16.0 * self.model.params / self._bw

    def publish_s(self) -> float:
        """Gather the full bf16 weights and stage them in host memory for pullers (one host link)."""
        return self.model.weight_bytes / (self.accelerator.host_bytes_per_s * self.efficiency)


def gpu_timing(model: str, accelerator_name: str, gpus: int, efficiency: float = EFFICIENCY) -> GpuTiming:
    """The timing of `gpus` accelerators named accelerator_name running the named model."""
    return GpuTiming(model_shape(model), accelerator(accelerator_name), gpus, efficiency)


def startup_s() -> float:
    """Seconds from a preemptible instance's placement to its engine asking for weights."""
    return INSTANCE_CREATE_S + ENGINE_WARMUP_S


def transfer_s(nbytes: float, bytes_per_s: float = LINK_BYTES_PER_S) -> float:
    """A payload over a link (weights to an instance, KV pages between engines)."""
    if not bytes_per_s > 0:
        raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
    return max(0.0, nbytes) / bytes_per_s
