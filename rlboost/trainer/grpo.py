"""GRPO objective: group-normalised advantages and the clipped policy-gradient loss.

Pure torch functions over [B, T] tensors aligned with the input ids (position t holds the
log-probability of token t given tokens < t), so the same code serves any model and any
micro-batch layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

AGGREGATIONS = ("token_mean", "seq_mean")


@dataclass(kw_only=True, slots=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO loss.

    clip_eps_low / clip_eps_high bound the importance ratio to [1 - low, 1 + high]
    (equal values give PPO's symmetric clip; a larger high value is DAPO's clip-higher).
    kl_coef > 0 adds a k3 estimate of KL(policy || reference) per token.
    aggregation "token_mean" averages over every response token of the batch (long answers
    weigh more); "seq_mean" averages per sequence first, then over sequences.
    """

    clip_eps_low: float = 0.2
    """the importance ratio is clipped below at 1 - clip_eps_low"""
    clip_eps_high: float = 0.2
    """... and above at 1 + clip_eps_high (larger than low: DAPO's clip-higher)"""
    kl_coef: float = 0.0
    """weight of a per-token KL(policy || reference) penalty (0: none)"""
    normalize_std: bool = True
    """divide each group's advantages by its reward standard deviation"""
    std_eps: float = 1e-6
    """added to that standard deviation"""
    aggregation: str = "token_mean"
    """token_mean (every response token weighs the same) or seq_mean"""
    is_weight_cap: float = 2.0
    """bounded staleness only: behaviour importance weights are truncated at this (TIS's C=2)"""

    def __post_init__(self) -> None:
        if not 0.0 < self.clip_eps_low < 1.0:
            raise ValueError(f"clip_eps_low must be in (0, 1), got {self.clip_eps_low}")
        if not 0.0 < self.clip_eps_high <= 10.0:
            raise ValueError(f"clip_eps_high must be in (0, 10], got {self.clip_eps_high}")
        if not self.kl_coef >= 0.0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if not self.std_eps > 0.0:
            raise ValueError(f"std_eps must be > 0, got {self.std_eps}")
        if not 1.0 <= self.is_weight_cap <= 100.0:
            raise ValueError(f"is_weight_cap must be in [1, 100], got {self.is_weight_cap}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")


@dataclass(frozen=True, slots=True)
class GRPOLoss:
    """The differentiable loss plus detached statistics of the batch it was computed on."""

    loss: torch.Tensor
    policy_loss: float
    kl: float
    clip_fraction: float
    mean_ratio: float
    num_tokens: int
    is_weight_mean: float = 1.0  # decoupled objective: mean behaviour importance weight (untruncated)
    is_truncated_fraction: float = 0.0  # ... and the share of tokens whose weight was truncated
    decoupled: bool = False


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, *,
                     normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Advantage of each sample: (reward - group mean) / (group std + eps).

    rewards: float [N]; group_ids: int [N], samples of one prompt share an id (any order).
    std is the unbiased (N-1) sample standard deviation, as in the GRPO paper's code; a
    group of one sample gets advantage 0. With normalize_std=False the result is only
    centred (Dr. GRPO), which does not up-weight groups whose rewards barely differ.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both be 1-D of one length, got "
                         f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    rewards = rewards.to(torch.float32)
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.numel(), dtype=torch.float32).index_add_(0, inverse, rewards)
    means = sums / counts
    centred = rewards - means[inverse]
    if not normalize_std:
        return centred
    sq = torch.zeros_like(sums).index_add_(0, inverse, centred * centred)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centred / (std[inverse] + eps)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    delta = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(delta) - delta - 1.0


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str,
              denominator: float | None = None, seq_lens: Sequence[int] | None = None) -> torch.Tensor:
    """Reduce per-token values [B, T] over the tokens where mask is true.

    token_mean: sum / (number of masked tokens); seq_mean: mean over sequences of each
    sequence's masked mean. denominator replaces the token count (token_mean) or the
    sequence count (seq_mean): pass the whole step's count when a step is split into
    micro-batches or ranks whose gradients are summed, so the sum equals the full mean.
    seq_lens: the row [1, N] holds packed sequences of these lengths (for seq_mean).
    """
    maskf = mask.to(values.dtype)
    if mode == "token_mean":
        total = (values * maskf).sum()
        count = maskf.sum() if denominator is None else denominator
    elif mode == "seq_mean":
        sums, counts = _per_sequence(values * maskf, maskf, seq_lens)
        per_seq = sums / counts.clamp(min=1.0)
        has_tokens = (counts > 0).to(values.dtype)
        total = (per_seq * has_tokens).sum()
        count = has_tokens.sum() if denominator is None else denominator
    else:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")
    if isinstance(count, torch.Tensor):
        count = count.clamp(min=1.0)
    elif count <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    return total / count


def _per_sequence(values: torch.Tensor, maskf: torch.Tensor, seq_lens: Sequence[int] | None):
    """(sum of values, number of masked tokens) per sequence: per row, or per packed segment."""
    if seq_lens is None:
        return values.sum(-1), maskf.sum(-1)
    if values.dim() != 2 or values.shape[0] != 1 or sum(seq_lens) != values.shape[1]:
        raise ValueError(f"packed values must be [1, {sum(seq_lens)}], got {tuple(values.shape)}")
    segment = torch.repeat_interleave(torch.arange(len(seq_lens), device=values.device),
                                      torch.tensor(seq_lens, device=values.device))
    zeros = torch.zeros(len(seq_lens), dtype=values.dtype, device=values.device)
    return zeros.index_add(0, segment, values[0]), zeros.index_add(0, segment, maskf[0])


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, config: GRPOConfig, ref_logprobs: torch.Tensor | None = None,
              denominator: float | None = None, seq_lens: Sequence[int] | None = None) -> GRPOLoss:
    """Clipped-ratio GRPO loss over the response tokens selected by mask.

    logprobs (with grad), old_logprobs (behaviour policy), ref_logprobs: float [B, T];
    advantages: [B] (one per sequence) or [B, T]; mask: bool [B, T], true on response
    tokens only (prompt and padding excluded). Per token:
        -min(r * A, clip(r, 1 - low, 1 + high) * A) + kl_coef * k3(logp, ref)
    with r = exp(logp - old_logp), then aggregated per config.aggregation. seq_lens: the
    tensors are one packed row [1, N] of sequences of these lengths (advantages per token).
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, old_logprobs "
                         f"{tuple(old_logprobs.shape)} and mask {tuple(mask.shape)} must match")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype)
    mask = mask.bool()
    # Masked positions may hold garbage (padding): zero the log-ratio there so exp() is finite.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    clipped = ratio.clamp(1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped * advantages
    per_token = -torch.minimum(unclipped_obj, clipped_obj)
    policy = aggregate(per_token, mask, config.aggregation, denominator, seq_lens)
    loss = policy
    kl_value = 0.0
    if config.kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl_tok = torch.where(mask, kl_k3(logprobs, ref_logprobs), torch.zeros_like(logprobs))
        kl = aggregate(kl_tok, mask, config.aggregation, denominator, seq_lens)
        loss = loss + config.kl_coef * kl
        kl_value = float(kl.detach())
    with torch.no_grad():
        n = int(mask.sum())
        was_clipped = (clipped_obj < unclipped_obj) & mask
        clip_frac = float(was_clipped.sum()) / max(n, 1)
        mean_ratio = float((ratio * mask).sum()) / max(n, 1)
    return GRPOLoss(loss=loss, policy_loss=float(policy.detach()), kl=kl_value,
                    clip_fraction=clip_frac, mean_ratio=mean_ratio, num_tokens=n)


def decoupled_loss(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, config: GRPOConfig, ref_logprobs: torch.Tensor | None = None,
                   denominator: float | None = None, seq_lens: Sequence[int] | None = None) -> GRPOLoss:
    """The decoupled PPO/GRPO loss for samples drawn by older weights (bounded staleness).

    AReaL's decoupled objective (Fu et al. 2025, arXiv 2505.24298, eq. 5) separates the
    behaviour policy that sampled a token from the proximal policy that anchors the trust
    region. Per token:
        -w * min(r * A, clip(r, 1 - low, 1 + high) * A) + kl_coef * k3(logp, ref)
    with r = exp(logp - logp_prox) and w = min(exp(logp_prox - logp_behav), is_weight_cap),
    the truncated importance weight of IMPALA's V-trace (Espeholt et al. 2018, arXiv
    1802.01561, rho-bar) and of truncated importance sampling (TIS; Yao et al. 2025, "Your
    Efficient RL Framework Secretly Brings You Off-Policy RL Training", C = 2). The proximal
    policy is the trainer's weights before this step's update: a step makes one optimizer
    update after all its micro-batches, so the weights of this forward are exactly those,
    and logp_prox is logp detached (r is 1 in value, its gradient that of logp). w is
    detached. behaviour_logprobs are the engine's (the samples' output_logprobs).
    """
    if logprobs.shape != behaviour_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, behaviour_logprobs "
                         f"{tuple(behaviour_logprobs.shape)} and mask {tuple(mask.shape)} must match")
    mask = mask.bool()
    prox = logprobs.detach()
    with torch.no_grad():
        log_w = torch.where(mask, prox - behaviour_logprobs, torch.zeros_like(prox))
        raw_w = torch.exp(log_w.clamp(max=20.0))
        weight = raw_w.clamp(max=config.is_weight_cap)
    per_sample_adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    out = grpo_loss(logprobs, prox, per_sample_adv * weight, mask, config, ref_logprobs, denominator, seq_lens)
    with torch.no_grad():
        n = int(mask.sum())
        truncated = float(((raw_w > config.is_weight_cap) & mask).sum()) / max(n, 1)
        mean_w = float((raw_w * mask).sum()) / max(n, 1)
    return GRPOLoss(loss=out.loss, policy_loss=out.policy_loss, kl=out.kl, clip_fraction=out.clip_fraction,
                    mean_ratio=mean_w, num_tokens=n, is_weight_mean=mean_w, is_truncated_fraction=truncated,
                    decoupled=True)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                   response_mask: torch.Tensor | None = None, *, temperature: float = 1.0,
                   chunk_bytes: int = 64 << 20) -> torch.Tensor:
    """Log-probability of each input token under a causal LM's logits, aligned to input_ids.

    logits: [B, T, V] from forward(input_ids), any float dtype; input_ids: [B, T]. Returns
    float32 [B, T] where out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) under
    softmax(logits / temperature) for t >= 1 and 0 at t = 0; positions outside
    response_mask (when given) are 0.

    Memory: computed a few positions at a time (about chunk_bytes of float32 logits each),
    so no float32 [B, T, V] copy exists, forward or backward: forward keeps one logsumexp
    per position, backward recomputes each chunk's softmax and writes the gradient in the
    logits' own dtype. With Qwen3's 151,936-token vocabulary a float32 copy of 8 x 2048
    positions alone is 10 GB (bench/logprob_memory.py).
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match input_ids "
                         f"{tuple(input_ids.shape)}")
    if not (temperature > 0.0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a positive number, got {temperature}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if response_mask is not None:
        if response_mask.shape != input_ids.shape:
            raise ValueError(f"response_mask {tuple(response_mask.shape)} does not match "
                             f"input_ids {tuple(input_ids.shape)}")
        if response_mask[:, 0].any():
            raise ValueError("response_mask must be false at position 0 (no token predicts it)")
    rows = max(1, chunk_bytes // (4 * max(logits.shape[-1], 1)))
    out = _ChosenLogProb.apply(logits, input_ids.long(), float(temperature), rows)
    if response_mask is not None:
        out = torch.where(response_mask.bool(), out, torch.zeros_like(out))
    return out


def _chunks(logits: torch.Tensor, rows: int):
    """(b, t0, t1): the predicting positions [t0, t1) of sequence b, at most `rows` at a time
    (each one row block of logits[b], contiguous when logits is)."""
    last = logits.shape[1] - 1
    for b in range(logits.shape[0]):
        for t0 in range(0, last, rows):
            yield b, t0, min(t0 + rows, last)


class _ChosenLogProb(torch.autograd.Function):
    """out[b, t + 1] = log_softmax(logits[b, t] / temperature)[ids[b, t + 1]], chunk by chunk."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, rows):
        batch, length, _ = logits.shape
        out = torch.zeros(batch, length, dtype=torch.float32, device=logits.device)
        lse = torch.empty(batch, max(length - 1, 0), dtype=torch.float32, device=logits.device)
        for b, t0, t1 in _chunks(logits, rows):
            x = logits[b, t0:t1].float()  # the logits themselves when already float32: not written
            if temperature != 1.0:
                x = x / temperature
            lse[b, t0:t1] = torch.logsumexp(x, dim=-1)
            picked = x.gather(-1, ids[b, t0 + 1:t1 + 1, None]).squeeze(-1)
            out[b, t0 + 1:t1 + 1] = picked - lse[b, t0:t1]
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        logits, ids, lse = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.empty_like(logits)
        grad[:, -1].zero_()  # the last position predicts nothing
        for b, t0, t1 in _chunks(logits, ctx.rows):
            g = grad_out[b, t0 + 1:t1 + 1].float().div(temperature)
            x = logits[b, t0:t1].to(torch.float32, copy=True)  # a chunk this loop may overwrite
            if temperature != 1.0:
                x.div_(temperature)
            # d out / d x = onehot(target) - softmax(x), scaled by 1 / temperature
            p = x.sub_(lse[b, t0:t1, None]).exp_().mul_(-g[:, None])
            p.scatter_add_(-1, ids[b, t0 + 1:t1 + 1, None], g[:, None])
            grad[b, t0:t1] = p
        return grad, None, None, None
