"""The trainer's memory plan: what one FSDP2 rank holds at its peak, term by term, from the
model's shape and the trainer's settings, so a config that cannot fit is refused before
anything starts (and `rlboost plan` shows why).

A step goes through phases that hold different things at once: the end of the forward
(every saved activation and the logits), the log-probs' backward (the logits and their
gradient), the head's backward (the head's gathered weights and gradient), the decoder
layers' backward (one layer recomputed under checkpointing, gathered weights and unsharded
gradients in flight) and the optimizer step (moments and the step's scratch). The plan
counts what each term holds in each phase, from the code that keeps it alive (see each
function's note); its peak is the largest phase. bench/trainer_memory.py checks that peak
against a measured one.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = float(1 << 30)
FP32 = 4
# CUDA context, cuBLAS workspaces and NCCL's own buffers: an allowance, not a count (NCCL's
# default buffer is 4 MiB per channel and peer, NCCL_BUFFSIZE; a CUDA context on a Hopper
# GPU takes about 0.5 GiB)
CUDA_RESERVED_BYTES = 1.5 * GIB
# the caching allocator never hands out every byte: this share of the GPU is left free
FRAGMENTATION_SHARE = 0.05
PHASES = ("forward", "log-prob bwd", "head bwd", "layers bwd", "optimizer")
"""the phases of a step, in order (what the plan's columns are)"""


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
    qk_norm: bool = False
    """an RMSNorm on each query and key head (Qwen3)"""
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
                   qk_norm=str(text.get("model_type", "")).startswith("qwen3"),
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
        attention = 2 * h * self.q_width + 2 * h * self.kv_width + (2 * self.head_dim if self.qk_norm else 0)
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

    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width one token goes through (top-k experts' in a mixture of experts)."""
        return self.experts_per_token * self.expert_intermediate if self.experts else self.intermediate

    @property
    def largest_param(self) -> int:
        """Elements of the largest single parameter (the embedding, or a fused experts tensor)."""
        experts = self.experts * 2 * self.expert_intermediate * self.hidden if self.experts else 0
        return max(self.vocab * self.hidden, self.hidden * self.intermediate, experts)

    def activation_bytes_per_token(self, compute_bytes: int) -> float:
        """What autograd keeps per token of one decoder layer (rlboost's DecoderLayer; the same
        pattern as transformers' Llama-family layers). Each RMSNorm keeps its float32 input
        (pow and div), its normalised product (the weight's multiply) and one float32 root per
        row, and its output is kept by the projections after it; the query and key norms'
        outputs are not kept, since RoPE multiplies them by cos and sin, which need no
        gradient. Attention keeps the rotated q and k, v, its output and one float32
        log-sum-exp per head, and o_proj the output's concatenation; the SwiGLU MLP keeps
        gate, silu(gate), up and their product. At compute_bytes=4 the casts to float32 are
        the tensors themselves, which the count already reflects."""
        b, h, q, kv = compute_bytes, self.hidden, self.q_width, self.kv_width
        norms = 2 * (FP32 * h + 2 * b * h + FP32)
        qk_norms = (FP32 * q + b * q + FP32 * self.heads + FP32 * kv + b * kv + FP32 * self.kv_heads
                    if self.qk_norm else 0)
        attention = b * q + 2 * b * kv + b * q + FP32 * self.heads + b * q
        router = FP32 * self.experts if self.experts else 0
        return norms + qk_norms + attention + 4 * b * self.mlp_width + router

    def shared_activation_bytes_per_token(self, compute_bytes: int) -> float:
        """What the forward keeps per token outside the layers: the final norm's float32
        input, normalised product and root, its output (kept by the head), and the RoPE cos
        and sin tables every layer shares."""
        b = compute_bytes
        return FP32 * self.hidden + 2 * b * self.hidden + FP32 + 2 * b * self.head_dim

    def backward_scratch_bytes_per_token(self, compute_bytes: int) -> float:
        """What one layer's backward holds beyond its saved tensors at its fullest, in the
        MLP's product rule: the gradients of the product, of silu(gate) and of up at once,
        plus the residual stream's gradient coming in and going out."""
        return compute_bytes * (3 * self.mlp_width + 2 * self.hidden)


KNOWN_MODELS = {
    # Qwen/Qwen3-8B config.json: 36 layers, hidden 4096, intermediate 12288, 32 query / 8 KV
    # heads of 128, vocabulary 151,936, untied head
    "qwen3-8b": ModelDims("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, qk_norm=True),
    # Qwen/Qwen3-1.7B config.json: 28 layers, hidden 2048, intermediate 6144, 16 / 8 heads of 128, tied
    "qwen3-1.7b": ModelDims("qwen3-1.7b", 151936, 2048, 6144, 28, 16, 8, 128, tied=True, qk_norm=True),
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json: 30 layers, hidden 576, intermediate 1536,
    # 9 / 3 heads of 64, vocabulary 49,152, tied
    "smollm2-135m": ModelDims("smollm2-135m", 49152, 576, 1536, 30, 9, 3, 64, tied=True),
}


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    """One line of the plan: bytes per rank in each of PHASES, and the setting that shrinks it."""

    name: str
    phases: tuple[float, ...]
    shrink: str

    @property
    def nbytes(self) -> float:
        """The most this term holds in any phase."""
        return max(self.phases)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-rank memory of the trainer, term by term and phase by phase, against a device's capacity."""

    terms: tuple[MemoryTerm, ...]
    device: str
    capacity_bytes: float | None
    tokens: int

    @property
    def phase_totals(self) -> tuple[float, ...]:
        return tuple(sum(t.phases[i] for t in self.terms) for i in range(len(PHASES)))

    @property
    def peak_phase(self) -> str:
        totals = self.phase_totals
        return PHASES[totals.index(max(totals))]

    @property
    def total_bytes(self) -> float:
        """The peak: the phase that holds the most."""
        return max(self.phase_totals)

    @property
    def usable_bytes(self) -> float | None:
        return None if self.capacity_bytes is None else self.capacity_bytes * (1 - FRAGMENTATION_SHARE)

    @property
    def fits(self) -> bool:
        return self.usable_bytes is None or self.total_bytes <= self.usable_bytes

    @property
    def largest(self) -> MemoryTerm:
        """The term that holds the most in the peak phase."""
        i = PHASES.index(self.peak_phase)
        return max(self.terms, key=lambda t: t.phases[i])

    def refusal(self) -> str:
        """One line: how far over, the largest term and the setting that shrinks it."""
        big, i = self.largest, PHASES.index(self.peak_phase)
        return (f"the trainer needs {self.total_bytes / 1e9:.1f} GB per rank at its peak ({self.peak_phase}), over "
                f"the {self.usable_bytes / 1e9:.1f} GB usable on a {self.device} ({self.capacity_bytes / 1e9:.0f} GB); "
                f"the largest term is {big.name} ({big.phases[i] / 1e9:.1f} GB): {big.shrink} "
                f"(rlboost plan shows every term)")

    def table(self) -> str:
        rows = [(t.name, *(f"{b / 1e9:.2f}" for b in t.phases), t.shrink) for t in self.terms]
        rows.append(("total", *(f"{b / 1e9:.2f}" for b in self.phase_totals), f"peak: {self.peak_phase}"))
        head = ("term (GB per rank)", *PHASES, "shrinks with")
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head) - 1)]

        def line(r):
            cells = [f"{r[0]:<{widths[0]}}", *(f"{c:>{w}}" for c, w in zip(r[1:-1], widths[1:])), r[-1]]
            return "  ".join(cells).rstrip()

        out = [line(head), *(line(r) for r in rows), f"peak {self.total_bytes / 1e9:.2f} GB ({self.peak_phase})"]
        if self.capacity_bytes is not None:
            out[-1] += (f"; usable on {self.device} {self.usable_bytes / 1e9:.2f} GB: "
                        f"{'fits' if self.fits else 'DOES NOT FIT'}")
        return "\n".join(out)


def plan_trainer_memory(dims: ModelDims, *, world_size: int, tokens: int, compute_bytes: int,
                        checkpointing: bool, offload: bool, chunk_bytes: int = 64 << 20,
                        device: str = "cpu", capacity_bytes: float | None = None, cuda: bool = False,
                        engine_bytes: float = 0.0, engine_shrink: str = "", gathered_copies: bool = True,
                        micro_batches: int = 1, reshard_after_forward: bool = True,
                        reduce_bytes: int | None = None) -> MemoryPlan:
    """The per-rank plan for `tokens` tokens in one forward (the micro-batch's, padding included),
    in a run's steady state (AdamW's moments exist from the first step on).

    micro_batches: how many a rank runs per step; past the first, the sharded gradients of
    the earlier ones are alive through the forward. gathered_copies=False plans a model
    that is not sharded (one process, no FSDP). reduce_bytes: the dtype FSDP reduces
    gradients in (default the compute dtype).
    """
    b, f = compute_bytes, _fsdp_terms(dims, world_size=world_size, compute_bytes=compute_bytes, offload=offload,
                                      cuda=cuda, gathered=gathered_copies, micro_batches=micro_batches,
                                      reshard=reshard_after_forward, reduce_bytes=reduce_bytes or compute_bytes)
    terms = [*f, _activations(dims, tokens, b, checkpointing), _logits(dims, tokens, b, chunk_bytes),
             MemoryTerm("NCCL buffers and CUDA context", _every(CUDA_RESERVED_BYTES if cuda else 0.0), "-")]
    if engine_bytes:
        terms.append(MemoryTerm("colocated rollout engine", _every(engine_bytes), engine_shrink))
    return MemoryPlan(tuple(terms), device, capacity_bytes, tokens)


def _every(nbytes: float) -> tuple[float, ...]:
    return (nbytes,) * len(PHASES)


def _fsdp_terms(dims: ModelDims, *, world_size: int, compute_bytes: int, offload: bool, cuda: bool,
                gathered: bool, micro_batches: int, reshard: bool, reduce_bytes: int) -> list[MemoryTerm]:
    """Parameters, gradients and optimizer state (FSDP2's fully_shard per layer, then the root).

    The float32 shards of parameters, gradients and AdamW's two moments stay all step (with
    offload they live in host memory: none on the device, and the step runs there). The
    gradient shards exist from the first backward until optimizer_step sets them to None.
    Gathered compute copies: after the forward every module is resharded (rlboost sets
    reshard_after_forward on the root too, which FSDP2 then honours), so nothing is
    gathered until backward gathers the root (head) and prefetches the last layer, then
    holds the root and two layers (one computing, one prefetched); with
    reshard_after_forward off, the whole model stays gathered from forward to backward.
    Unsharded gradients: the head's from its backward until the root's reduce-scatter at
    the end, and a layer's in the compute dtype plus its reduce-scatter input in the
    reduce dtype. The step's scratch: torch's foreach AdamW (the default on a GPU) takes
    one float32 copy of the shard's second moments for their square root; the per-tensor
    AdamW on a CPU takes two of the largest parameter's.
    """
    keep = 0.0 if offload else 1.0
    shard = dims.params / world_size * FP32 * keep
    b, root, layer = compute_bytes, dims.root_params, dims.layer_params
    if not gathered:
        copies = (0.0,) * 5
    elif reshard:
        copies = (0.0, 0.0, (root + layer) * b, (root + 2 * layer) * b, 0.0)
    else:
        copies = (dims.params * b,) * 4 + (0.0,)
    early = shard if micro_batches > 1 else 0.0
    if gathered:
        head = dims.vocab * dims.hidden * b
        unsharded = (0.0, 0.0, head, head + layer * (b + reduce_bytes), 0.0)
    else:  # no FSDP: the head's gradient is its own .grad, once the first backward made it
        unsharded = (0.0, 0.0, 0.0 if early else dims.vocab * dims.hidden * FP32 * keep, 0.0, 0.0)
    scratch = shard if cuda else 2 * dims.largest_param / world_size * FP32 * keep
    hint = "more trainer.world_size (ranks)" if offload else "set trainer.optimizer.offload=true"
    return [
        MemoryTerm("parameters", tuple(shard + c for c in copies[:4]) + (shard,), hint),
        MemoryTerm("gradients", tuple(g + u for g, u in zip((early, early, early, shard, shard), unsharded)), hint),
        MemoryTerm("optimizer state", _every(2 * shard), hint),
        MemoryTerm("optimizer step scratch", (0.0,) * 4 + (scratch,), hint),
    ]


def _activations(dims: ModelDims, tokens: int, b: int, checkpointing: bool) -> MemoryTerm:
    """What the forward keeps for backward, then what the layers' backward holds: every
    layer's saved tensors, or with checkpointing each layer's input, then one layer
    recomputed at a time; plus the tensors shared outside the layers and one layer's
    backward scratch."""
    per_layer = dims.activation_bytes_per_token(b) * tokens
    shared = dims.shared_activation_bytes_per_token(b) * tokens
    rope = 2 * b * dims.head_dim * tokens
    scratch = dims.backward_scratch_bytes_per_token(b) * tokens
    if checkpointing:
        kept = dims.layers * dims.hidden * b * tokens
        backward = kept + per_layer + rope + scratch
        hint = "a smaller trainer.max_tokens_per_micro_batch"
    else:
        kept = dims.layers * per_layer
        backward = kept + rope + scratch
        hint = "set trainer.activation_checkpointing=true"
    return MemoryTerm(f"activations ({tokens} tokens)", (kept + shared,) * 3 + (backward, 0.0), hint)


def _logits(dims: ModelDims, tokens: int, b: int, chunk_bytes: int) -> MemoryTerm:
    """The head's logits, kept by the chunked log-probs for their backward (grpo.token_logprobs),
    and their chunks of float32 rows: the forward takes one for logsumexp's shifted copy, and
    one more for the float32 cast when the logits are narrower; the backward holds the
    logits, their whole gradient (in the logits' dtype) and one float32 chunk; the head's
    backward, the gradient alone. A sampling temperature other than 1 divides the logits
    into a new tensor (the undivided ones are freed once it exists) and in backward their
    gradient likewise (after the log-probs' backward has freed the logits): two
    logits-sized tensors at a time, never more than the log-probs' backward holds."""
    logits = tokens * dims.vocab * b
    rows = max(1, chunk_bytes // (FP32 * dims.vocab))
    chunk = min(rows, tokens) * dims.vocab * FP32
    forward = logits + chunk * (1 if b == FP32 else 2)
    return MemoryTerm("logits and log-prob chunk", (forward, 2 * logits + chunk, logits, 0.0, 0.0),
                      "a smaller trainer.max_tokens_per_micro_batch")


def tokens_per_forward(*, max_tokens: int | None, sample_tokens: int, samples_per_rank: int) -> int:
    """The most tokens one forward can hold: the budget (or a longer sample, which goes alone),
    or without a budget every sample of the rank's share at the longest length."""
    if max_tokens is not None:
        return max(max_tokens, sample_tokens)
    return samples_per_rank * sample_tokens
