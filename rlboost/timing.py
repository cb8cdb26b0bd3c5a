"""The timing model: how long a named model takes on named accelerators to decode, prefill,
train and publish its weights, with inputs from independent measurements (timing_inputs.toml).

A decode step reads the weights (or, for a large batch, does its matmuls, whichever takes
longer), reads every cached token's K and V, and all-reduces twice per layer under tensor
parallelism; each term has its own efficiency, derived from a measured engine (TimingInputs).
Training runs at the efficiency of a measured GRPO step, plus that step's measured overhead.
Emulated engines, the emulated trainer and the simulator all take their durations from here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

INPUTS_FILE = Path(__file__).with_name("timing_inputs.toml")
_DATA = tomllib.loads(INPUTS_FILE.read_text())

# Forward-pass equivalents per trained token in a GRPO step as verl runs it: old log-probs (1),
# reference log-probs for the KL loss (1), the actor's forward (1) and backward (2), and the
# forward again under activation checkpointing (1).
TRAIN_FORWARD_PASSES = 6


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
    """A decoder's shape from its config.json (bf16 weights and KV cache); its parameters
    follow from it (the matmuls and embeddings; norms, under 0.01%, are left out).

    >>> round(model_shape("qwen3-8b").params / 1e9, 2)
    8.19
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    source: str
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> float:
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate

    @property
    def embedding_params(self) -> float:
        return float(self.vocab * self.hidden)

    @property
    def params(self) -> float:
        """Every parameter (an untied LM head is a second vocab x hidden matrix)."""
        return self.layers * self.layer_params + self.embedding_params * (1 if self.tied else 2)

    @property
    def matmul_params(self) -> float:
        """Parameters every token multiplies through: all but an untied input embedding, which
        is a lookup of one row per token (neither FLOPs nor a read of the whole matrix)."""
        return self.params - (0.0 if self.tied else self.embedding_params)

    @property
    def weight_bytes(self) -> float:
        """Every parameter (what memory holds and a weight transfer moves)."""
        return self.params * self.dtype_bytes

    @property
    def step_weight_bytes(self) -> float:
        """Bytes of weights one forward step reads."""
        return self.matmul_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer: 2 * layers * kv_heads * head_dim * dtype bytes."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one query token against one cached token, all layers (QK^T and AV)."""
        return 4.0 * self.layers * self.q_heads * self.head_dim


ACCELERATORS = {name: Accelerator(name, **row) for name, row in _DATA["accelerators"].items()}
MODELS = {name: ModelShape(name, **row) for name, row in _DATA["models"].items()}


def accelerator(name: str) -> Accelerator:
    if name not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {sorted(ACCELERATORS)}, got {name!r}")
    return ACCELERATORS[name]


def model_shape(name: str) -> ModelShape:
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name]


@dataclass(frozen=True, slots=True)
class TimingInputs:
    """The model's inputs, each derived from one measurement of timing_inputs.toml.

    weights_read / kv_read: shares of peak HBM bandwidth a decode step reaches reading the
    weights and the cached K and V, and per_sequence_s its cost per running sequence (the
    measured engine's step time at no sequence, per sequence and per cached token);
    forward / train: shares of peak FLOP/s of verl's forward-only passes (prefill runs at
    it) and of all its GRPO passes; step_overhead_s: verl's seconds per step outside
    rollout and the passes; allreduce: measured (bytes, seconds) per tensor-parallel size.
    """

    weights_read: float
    kv_read: float
    per_sequence_s: float
    forward: float
    train: float
    step_overhead_s: float
    host_copy_bytes_per_s: float
    link_bytes_per_s: float
    instance_create_s: float
    engine_warmup_s: float
    allreduce: tuple[tuple[int, tuple[tuple[float, float], ...]], ...]  # (gpus, ((bytes, seconds), ...))


def mean_context(point) -> float:
    """Cached tokens of a fixed-length decode run [concurrency, input, output, ...], averaged
    over its steps."""
    return point[0] * (point[1] + point[2] / 2.0)


def decode_fit(data: dict = _DATA) -> tuple[float, float, float]:
    """(seconds at no sequence, per sequence, per cached token) of the measured engine's decode
    step: least squares through its points below the pool's limit (normal equations, 3 x 3)."""
    rows = [((1.0, float(p[0]), mean_context(p)), p[3] * 1e-3) for p in data["decode"]["points"]]
    m = [[sum(x[i] * x[j] for x, _ in rows) for j in range(3)] for i in range(3)]
    v = [sum(x[i] * y for x, y in rows) for i in range(3)]

    def det(a) -> float:
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))

    d = det(m)  # Cramer's rule: each coefficient is det(m with column k replaced by v) / det(m)
    t0, per_seq, per_token = (det([[v[i] if j == k else m[i][j] for j in range(3)] for i in range(3)]) / d
                              for k in range(3))
    return t0, per_seq, per_token


def _flops_share(data: dict, names) -> float:
    """Share of peak FLOP/s that verl's named passes reached over the measured step's tokens."""
    tr = data["training"]
    m, gpu = model_shape(tr["model"]), accelerator(tr["accelerator"])
    passes = [p for p in tr["passes"] if p[0] in names]
    flops = sum(p[1] for p in passes) * 2.0 * m.matmul_params * tr["tokens"]
    return flops / (tr["gpus"] * gpu.bf16_flops * sum(p[2] for p in passes))


def derive_inputs(data: dict = _DATA) -> TimingInputs:
    d, tr = data["decode"], data["training"]
    m, gpu = model_shape(d["model"]), accelerator(d["accelerator"])
    empty, per_seq, per_token = decode_fit(data)
    allreduce = tuple(sorted((int(key[2:]), tuple((float(b), float(s)) for b, s in rows))
                             for key, rows in data["allreduce"].items() if key.startswith("tp")))
    return TimingInputs(
        weights_read=m.step_weight_bytes / (d["gpus"] * gpu.hbm_bytes_per_s * empty),
        kv_read=m.kv_bytes_per_token / (d["gpus"] * gpu.hbm_bytes_per_s * per_token), per_sequence_s=per_seq,
        forward=_flops_share(data, tr["forward_passes"]), train=_flops_share(data, [p[0] for p in tr["passes"]]),
        step_overhead_s=float(tr["other_s"]), host_copy_bytes_per_s=float(data["host_copy"]["bytes_per_s"]),
        link_bytes_per_s=float(data["network"]["bytes_per_s"]),
        instance_create_s=float(data["startup"]["instance_create_s"]),
        engine_warmup_s=float(data["startup"]["engine_warmup_s"]), allreduce=allreduce)


INPUTS = derive_inputs()
LINK_BYTES_PER_S = INPUTS.link_bytes_per_s


def allreduce_s(nbytes: float, gpus: int, inputs: TimingInputs = INPUTS) -> float:
    """One all-reduce of nbytes over gpus GPUs: the measured table for that size (or the next
    larger one measured), interpolated, extended past its ends along its last segment."""
    if gpus <= 1:
        return 0.0
    rows = next((rows for size, rows in inputs.allreduce if size >= gpus), inputs.allreduce[-1][1])
    i = min(max(bisect.bisect_left([b for b, _ in rows], nbytes), 1), len(rows) - 1)
    (b0, s0), (b1, s1) = rows[i - 1], rows[i]
    return max(min(s for _, s in rows), s0 + (s1 - s0) * (nbytes - b0) / (b1 - b0))


@dataclass(frozen=True, slots=True)
class GpuTiming:
    """Durations of one engine (or trainer) of `gpus` accelerators running `model`.

    >>> t = gpu_timing("qwen3-8b", "h100-sxm", 1)
    >>> round(t.decode_step_s(batch=64, context=64 * 3072) * 1e3, 2)  # measured: 17.05 ms
    17.18

    `scale` multiplies every efficiency (1: as measured): a what-if, never a fit.
    """

    model: ModelShape
    accelerator: Accelerator
    gpus: int
    scale: float = 1.0
    inputs: TimingInputs = INPUTS
    # per batch size: a decode step's time with no cached token; per token count: the all-reduces
    # (engines ask at every event)
    _intercepts: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _comms: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {self.gpus}")
        if not 0.0 < self.scale <= 1.0:
            raise ValueError(f"scale must be in (0, 1], got {self.scale}")

    @property
    def _bw(self) -> float:
        return self.gpus * self.accelerator.hbm_bytes_per_s * self.scale

    @property
    def _flops(self) -> float:
        return self.gpus * self.accelerator.bf16_flops * self.scale

    # -- decode --------------------------------------------------------------------------

    def comm_s(self, tokens: float) -> float:
        """Tensor-parallel communication of a forward over `tokens` tokens: two all-reduces of
        tokens x hidden bf16 values per layer (after attention and after the MLP)."""
        s = self._comms.get(tokens)
        if s is None:
            m = self.model
            s = self._comms[tokens] = 2 * m.layers * allreduce_s(tokens * m.hidden * m.dtype_bytes, self.gpus,
                                                                 self.inputs)
        return s

    def decode_intercept_s(self, batch: int) -> float:
        """A decode step of `batch` samples less its cached tokens' read: the weights' read, the
        per-sequence cost, and the all-reduces. The measured engine's steps up to 256
        sequences show no compute bound, so the model has none for decode: far larger batches
        would be underestimated."""
        a = self._intercepts.get(batch)
        if a is None:
            a = self._intercepts[batch] = (self.weights_read_s() + self.inputs.per_sequence_s * batch
                                           + self.comm_s(batch))
        return a

    def kv_read_s(self) -> float:
        """Seconds a decode step spends per cached token (K and V of every layer)."""
        return self.model.kv_bytes_per_token / (self._bw * self.inputs.kv_read)

    def decode_step_s(self, batch: int, context: float) -> float:
        """One decode step of `batch` samples holding `context` cached tokens in all."""
        return self.decode_intercept_s(batch) + self.kv_read_s() * context

    def decode_time_s(self, batch: int, context: float, steps: float) -> float:
        """Seconds for `steps` decode steps starting at `context` cached tokens; each step
        adds `batch` tokens to the cache (steps may be fractional)."""
        if steps <= 0 or batch <= 0:
            return 0.0
        a, b = self.decode_intercept_s(batch), self.kv_read_s()
        return a * steps + b * (context * steps + batch * steps * steps / 2.0)

    def decode_steps_in(self, batch: int, context: float, seconds: float) -> float:
        """How many decode steps fit in `seconds` from `context` (the inverse of decode_time_s)."""
        if seconds <= 0 or batch <= 0:
            return 0.0
        a, b = self.decode_intercept_s(batch) + self.kv_read_s() * context, self.kv_read_s() * batch / 2.0
        return 2.0 * seconds / (a + math.sqrt(a * a + 4.0 * b * seconds))  # the positive root, stably

    # -- prefill, training, publishing --------------------------------------------------------

    def weights_read_s(self) -> float:
        """One pass over the weights at the measured read efficiency (a step's floor)."""
        return self.model.step_weight_bytes / (self._bw * self.inputs.weights_read)

    def prefill_s(self, tokens: float, past: float = 0.0) -> float:
        """Prefill `tokens` after `past` cached ones (a resumed sample) on its own: its compute,
        or the weights' read, whichever is longer."""
        if tokens <= 0:
            return 0.0
        return max(self.prefill_compute_s(tokens, past), self.weights_read_s())

    def prefill_compute_s(self, tokens: float, past: float = 0.0) -> float:
        """The compute part of a prefill (a batch of prompts adds these, and reads the weights
        once): 2 x matmul params per token and causal attention at the efficiency of a measured
        forward pass (verl's; an inference engine's prefill may run faster), and the all-reduces."""
        m = self.model
        flops = 2.0 * m.matmul_params * tokens + m.attention_flops_per_pair * tokens * (past + tokens / 2.0)
        return flops / (self._flops * self.inputs.forward) + self.comm_s(tokens)

    def train_s(self, sequences: float, tokens: float, squared_tokens: float) -> float:
        """One GRPO pass over `sequences` of `tokens` in all (prompt + response) whose squared
        lengths sum to `squared_tokens`: TRAIN_FORWARD_PASSES forward equivalents, each
        2 x matmul params per token plus causal attention (half the square of each length)."""
        if tokens <= 0:
            return 0.0
        m = self.model
        forward = 2.0 * m.matmul_params * tokens + m.attention_flops_per_pair * squared_tokens / 2.0
        return TRAIN_FORWARD_PASSES * forward / (self._flops * self.inputs.train)

    def step_overhead_s(self) -> float:
        """A step's seconds outside rollout and the passes (optimizer step, bookkeeping), as
        measured at 7B on 8 GPUs and taken as is for every model and cluster."""
        return self.inputs.step_overhead_s

    def publish_s(self) -> float:
        """Copy the full bf16 weights to host memory for pullers (one GPU's host link)."""
        return self.model.weight_bytes / self.inputs.host_copy_bytes_per_s


def gpu_timing(model: str, accelerator_name: str, gpus: int, scale: float = 1.0) -> GpuTiming:
    """The timing of `gpus` accelerators named accelerator_name running the named model."""
    return GpuTiming(model_shape(model), accelerator(accelerator_name), gpus, scale)


def startup_s() -> float:
    """Seconds from a preemptible instance's placement to its engine asking for weights."""
    return INPUTS.instance_create_s + INPUTS.engine_warmup_s


def transfer_s(nbytes: float, bytes_per_s: float = LINK_BYTES_PER_S) -> float:
    """A payload over a link (weights to an instance, KV pages between engines)."""
    if not bytes_per_s > 0:
        raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
    return max(0.0, nbytes) / bytes_per_s
