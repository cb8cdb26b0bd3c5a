"""The trainer's memory plan: what one FSDP2 rank holds at its peak, term by term, from the
model's shape and the trainer's settings, so a config that cannot fit is refused before
anything starts (and `rlboost plan` shows why).

Every term is what rlboost's own code keeps alive, counted from the code that keeps it
(see each function's note); bench/trainer_memory.py checks the sum against a measured peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = float(1 << 30)
FP32 = 4
# CUDA context, cuBLAS workspaces and NCCL's own buffers: an allowance, not a count (NCCL's
# default buffer is 4 MiB per channel and peer, NCCL_BUFFSIZE; a CUDA context on a Hopper
# GPU takes about 0.5 GiB)
CUDA_RESERVED_BYTES = 1.5 * GIB
# the caching allocator never hands out every byte: this share of the GPU is left free
FRAGMENTATION_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class ModelDims:
    """The shape of a decoder as its config.json gives it (dense or mixture-of-experts).

    >>> d = KNOWN_MODELS["qwen3-8b"]
    >>> round(d.params / 1e9, 2)
    8.19
    """

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = False
    experts: int = 0
    """routed experts per layer (0: a dense MLP)"""
    experts_per_token: int = 0
    expert_intermediate: int = 0

    @classmethod
    def from_hf_config(cls, hf: dict, name: str = "") -> ModelDims:
        """From a Hugging Face config.json dict (Llama, Qwen, Mistral, Mixtral, Qwen3-MoE, ...)."""
        text = hf.get("text_config") or hf  # multimodal configs nest the decoder's
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        experts = int(text.get("num_experts") or text.get("num_local_experts") or 0)
        return cls(name=name or str(text.get("model_type", "model")), vocab=int(text["vocab_size"]), hidden=hidden,
                   intermediate=int(text.get("intermediate_size") or 4 * hidden),
                   layers=int(text["num_hidden_layers"]), heads=heads,
                   kv_heads=int(text.get("num_key_value_heads") or heads),
                   head_dim=int(text.get("head_dim") or hidden // heads),
                   tied=bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
                   experts=experts, experts_per_token=int(text.get("num_experts_per_tok") or 0) if experts else 0,
                   expert_intermediate=int(text.get("moe_intermediate_size") or text.get("intermediate_size") or 0)
                   if experts else 0)

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden
        attention = 2 * h * self.q_width + 2 * h * self.kv_width + 2 * self.head_dim
        if self.experts:
            mlp = self.experts * 3 * h * self.expert_intermediate + h * self.experts
        else:
            mlp = 3 * h * self.intermediate
        return attention + mlp + 2 * h

    @property
    def root_params(self) -> int:
        """Embeddings, the final norm and an untied head: what FSDP's root module holds."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def activation_bytes_per_token(self, compute_bytes: int) -> float:
        """What autograd keeps per token of one decoder layer (rlboost's DecoderLayer, and the
        same pattern in transformers' Llama-family layers): each RMSNorm keeps its float32
        input and its normalised output twice (its own product and the next projection's
        input); q and k add the float32 input of their norm, the norm's output, the rotated
        half and the rotated result; attention keeps its output and, for o_proj, a copy of
        it, plus one float32 log-sum-exp per head; the SwiGLU MLP keeps gate, silu(gate),
        up and their product (top-k experts' worth in a mixture of experts)."""
        b, h, q, kv = compute_bytes, self.hidden, self.q_width, self.kv_width
        mlp_width = self.experts_per_token * self.expert_intermediate if self.experts else self.intermediate
        norms = 2 * (FP32 * h + 2 * b * h)
        attention = FP32 * q + 6 * b * q + FP32 * kv + 5 * b * kv + FP32 * self.heads
        return norms + attention + 4 * b * mlp_width + (FP32 * self.experts if self.experts else 0)


KNOWN_MODELS = {
    # Qwen/Qwen3-8B config.json: 36 layers, hidden 4096, intermediate 12288, 32 query / 8 KV
    # heads of 128, vocabulary 151,936, untied head
    "qwen3-8b": ModelDims("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128),
    # Qwen/Qwen3-1.7B config.json: 28 layers, hidden 2048, intermediate 6144, 16 / 8 heads of 128, tied
    "qwen3-1.7b": ModelDims("qwen3-1.7b", 151936, 2048, 6144, 28, 16, 8, 128, tied=True),
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json: 30 layers, hidden 576, intermediate 1536,
    # 9 / 3 heads of 64, vocabulary 49,152, tied
    "smollm2-135m": ModelDims("smollm2-135m", 49152, 576, 1536, 30, 9, 3, 64, tied=True),
}


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    """One line of the plan: bytes per rank, and the setting that shrinks it."""

    name: str
    nbytes: float
    shrink: str


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-rank peak memory of the trainer, term by term, against a device's capacity."""

    terms: tuple[MemoryTerm, ...]
    device: str
    capacity_bytes: float | None
    tokens: int

    @property
    def total_bytes(self) -> float:
        return sum(t.nbytes for t in self.terms)

    @property
    def usable_bytes(self) -> float | None:
        return None if self.capacity_bytes is None else self.capacity_bytes * (1 - FRAGMENTATION_SHARE)

    @property
    def fits(self) -> bool:
        return self.usable_bytes is None or self.total_bytes <= self.usable_bytes

    @property
    def largest(self) -> MemoryTerm:
        return max(self.terms, key=lambda t: t.nbytes)

    def refusal(self) -> str:
        """One line: how far over, the largest term and the setting that shrinks it."""
        big = self.largest
        return (f"the trainer needs {self.total_bytes / 1e9:.1f} GB per rank, over the {self.usable_bytes / 1e9:.1f} GB "
                f"usable on a {self.device} ({self.capacity_bytes / 1e9:.0f} GB); the largest term is {big.name} "
                f"({big.nbytes / 1e9:.1f} GB): {big.shrink} (rlboost plan shows every term)")

    def table(self) -> str:
        rows = [(t.name, f"{t.nbytes / 1e9:.2f}", t.shrink) for t in self.terms]
        rows.append(("total", f"{self.total_bytes / 1e9:.2f}", ""))
        if self.capacity_bytes is not None:
            rows.append((f"usable on {self.device}", f"{self.usable_bytes / 1e9:.2f}",
                         "fits" if self.fits else "DOES NOT FIT"))
        w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        head = f"{'term':<{w0}}  {'GB':>{w1}}  shrinks with"
        return "\n".join([head, *(f"{a:<{w0}}  {b:>{w1}}  {c}".rstrip() for a, b, c in rows)])


def plan_trainer_memory(dims: ModelDims, *, world_size: int, tokens: int, compute_bytes: int,
                        checkpointing: bool, offload: bool, chunk_bytes: int = 64 << 20,
                        device: str = "cpu", capacity_bytes: float | None = None, cuda: bool = False,
                        engine_bytes: float = 0.0, engine_shrink: str = "", gathered_copies: bool = True) -> MemoryPlan:
    """The per-rank plan for `tokens` tokens in one forward (the micro-batch's, padding included).

    Parameters: the float32 shard (the master copy) plus the gathered compute copies FSDP2
    holds at once: the root (embeddings, head) and two decoder layers (one computing, one
    prefetched). Gradients: the float32 shard plus one layer's and the root's gathered
    gradients before their reduce-scatter. Optimizer: AdamW's two float32 moments of the
    shard. With offload the shards, their gradients and the moments live in host memory.
    Activations: every layer's saved tensors, or with checkpointing each layer's input
    plus one layer recomputed in backward. Logits: the head's output, kept for the chunked
    log-probs' backward, and its gradient, plus a few float32 chunks. gathered_copies=False
    plans a model that is not sharded (one process, no FSDP): no gathered copies.
    """
    shard = dims.params / world_size
    gathered = (dims.root_params + 2 * dims.layer_params) * compute_bytes if gathered_copies else 0.0
    gathered_grads = (dims.root_params + dims.layer_params) * compute_bytes if gathered_copies else 0.0
    bigger = "more trainer.world_size (ranks)"
    offload_hint = bigger if offload else "set trainer.optimizer.offload=true"
    per_layer = dims.activation_bytes_per_token(compute_bytes) * tokens
    if checkpointing:
        activations = dims.layers * dims.hidden * compute_bytes * tokens + per_layer
        act_hint = "a smaller trainer.max_tokens_per_micro_batch"
    else:
        activations = dims.layers * per_layer
        act_hint = "set trainer.activation_checkpointing=true"
    logits = 2 * tokens * dims.vocab * compute_bytes + 3 * min(chunk_bytes, tokens * dims.vocab * FP32)
    terms = [
        MemoryTerm("parameters", (0 if offload else shard * FP32) + gathered, offload_hint),
        MemoryTerm("gradients", (0 if offload else shard * FP32) + gathered_grads, offload_hint),
        MemoryTerm("optimizer state", 0 if offload else 2 * shard * FP32, offload_hint),
        MemoryTerm(f"activations ({tokens} tokens)", activations, act_hint),
        MemoryTerm("logits and log-prob chunk", logits, "a smaller trainer.max_tokens_per_micro_batch"),
        MemoryTerm("NCCL buffers and CUDA context", CUDA_RESERVED_BYTES if cuda else 0.0, "-"),
    ]
    if engine_bytes:
        terms.append(MemoryTerm("colocated rollout engine", engine_bytes, engine_shrink))
    return MemoryPlan(tuple(terms), device, capacity_bytes, tokens)


def tokens_per_forward(*, max_tokens: int | None, sample_tokens: int, samples_per_rank: int) -> int:
    """The most tokens one forward can hold: the budget (or a longer sample, which goes alone),
    or without a budget every sample of the rank's share at the longest length."""
    if max_tokens is not None:
        return max(max_tokens, sample_tokens)
    return samples_per_rank * sample_tokens


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else math.inf
