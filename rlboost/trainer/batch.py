"""Finished samples -> training micro-batches (padded, or packed without padding), and the
loss of a model on one.

A micro-batch is built from whole prompt groups, so group-normalised advantages computed
when it is built equal those of the full step; it may then be split (trainer.split) into
forwards that hold parts of groups, since each sample carries its own advantage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlboost.controller.staleness import check_changes, check_within
from rlboost.errors import StaleSampleError
from rlboost.migration.state import RequestState
from rlboost.models.decoder import DecoderLM
from rlboost.models.packed import packed_positions
from rlboost.trainer.grpo import GRPOConfig, GRPOLoss, decoupled_loss, group_advantages, grpo_loss, token_logprobs
from rlboost.validate import check_format_version

SAMPLE_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class ScoredSample:
    """One finished generation with its reward: what the collector hands the trainer.

    >>> ScoredSample(sample_id=3, group_id=1, prompt_ids=(5, 6), output_ids=(7, 2),
    ...              output_logprobs=(-0.5, -0.125), reward=1.0, weight_version=4).num_tokens
    4

    output_logprobs are the behaviour policy's log-probabilities of output_ids (the
    engine's float32 values); group_id is shared by the samples of one prompt.
    temperature is the sampling temperature they were drawn at: engines report
    log-probabilities under softmax(logits / temperature) (plain softmax for greedy, 0),
    and the trainer scores its own model the same way so the importance ratio is 1 on policy.
    version_changes: where a sample that spans a weight update changed version, as
    (token index, version) points (rlboost.controller.staleness); empty when
    weight_version produced every token. model_mask, for an episode (a multi-turn sample
    whose output holds the environment's observations between the model's turns): True on
    the output tokens the model wrote, the only ones the loss is taken on; empty: every
    output token is the model's.
    """

    sample_id: int
    group_id: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    reward: float
    weight_version: int = 0
    temperature: float = 1.0
    version_changes: tuple[tuple[int, int], ...] = ()
    model_mask: tuple[bool, ...] = ()
    format_version: int = SAMPLE_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, SAMPLE_FORMAT_VERSION)
        if self.model_mask and (len(self.model_mask) != len(self.output_ids) or not any(self.model_mask)):
            raise ValueError(f"sample {self.sample_id}: model_mask must hold one flag per output token "
                             f"({len(self.output_ids)}), some of them True; got {len(self.model_mask)}")
        if self.version_changes:
            check_changes(self.version_changes, len(self.output_ids))
        if not self.prompt_ids:
            raise ValueError(f"sample {self.sample_id}: prompt_ids must not be empty")
        if not self.output_ids:
            raise ValueError(f"sample {self.sample_id}: output_ids must not be empty")
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(f"sample {self.sample_id}: output_ids ({len(self.output_ids)}) and "
                             f"output_logprobs ({len(self.output_logprobs)}) differ in length")
        if not math.isfinite(self.reward):
            raise ValueError(f"sample {self.sample_id}: reward must be finite, got {self.reward}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"sample {self.sample_id}: temperature must be a finite number >= 0, "
                             f"got {self.temperature}")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def model_tokens(self) -> int:
        """Output tokens the model wrote (the loss is taken on these)."""
        return sum(self.model_mask) if self.model_mask else len(self.output_ids)

    @property
    def changes(self) -> tuple[tuple[int, int], ...]:
        """The version of every output token as change points (one when nothing changed)."""
        return self.version_changes or ((0, self.weight_version),)

    @classmethod
    def from_request(cls, state: RequestState, *, group_id: int, reward: float) -> ScoredSample:
        """The scored form of a finished engine sample."""
        if not state.finished:
            raise ValueError(f"sample {state.sample_id} is still running")
        return cls(sample_id=state.sample_id, group_id=group_id, prompt_ids=state.prompt_ids,
                   output_ids=state.output_ids, output_logprobs=state.output_logprobs,
                   reward=reward, weight_version=state.weight_version,
                   temperature=state.params.temperature)


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """Tensors of one micro-batch; every [B, T] tensor is aligned to input_ids.

    Right-padded ([B, T], one row per sample), or packed when seq_lens is given: one row
    [1, N] holding the samples end to end, N = sum(seq_lens), with no padding (positions
    restart at every sample, attention stays inside it). response_mask is true exactly on
    output tokens; old_logprobs holds their behaviour log-probabilities there and 0
    elsewhere; advantages, rewards and group_ids hold one value per sample. temperature
    is the samples' common sampling temperature (see ScoredSample). decoupled: the batch
    may hold samples of older weights (bounded staleness), so its loss is grpo.decoupled_loss.
    """

    input_ids: torch.Tensor       # int64 [B, T]
    attention_mask: torch.Tensor  # int64 [B, T], 1 on real tokens
    response_mask: torch.Tensor   # bool [B, T]
    old_logprobs: torch.Tensor    # float32 [B, T]
    advantages: torch.Tensor      # float32 [B]
    rewards: torch.Tensor         # float32 [B]
    group_ids: torch.Tensor       # int64 [B]
    sample_ids: tuple[int, ...]
    weight_versions: tuple[int, ...]
    temperature: float = 1.0
    seq_lens: tuple[int, ...] | None = None  # packed: each sample's length, in row order
    decoupled: bool = False

    @property
    def packed(self) -> bool:
        return self.seq_lens is not None

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    @property
    def num_sequences(self) -> int:
        return len(self.seq_lens) if self.seq_lens is not None else int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens one forward computes: padding included when padded."""
        return int(self.input_ids.numel())

    def token_advantages(self) -> torch.Tensor:
        """Advantages aligned to input_ids: [B] when padded (one per row), [1, N] when packed."""
        if self.seq_lens is None:
            return self.advantages
        lens = torch.tensor(self.seq_lens, device=self.advantages.device)
        return torch.repeat_interleave(self.advantages, lens)[None]

    def denominator(self, aggregation: str) -> int:
        """This micro-batch's share of a step-wide denominator (see grpo.aggregate)."""
        return self.num_response_tokens if aggregation == "token_mean" else self.num_sequences

    def to(self, device: torch.device | str) -> MicroBatch:
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return MicroBatch(move(self.input_ids), move(self.attention_mask),
                          move(self.response_mask), move(self.old_logprobs),
                          move(self.advantages), move(self.rewards), move(self.group_ids),
                          self.sample_ids, self.weight_versions, self.temperature, self.seq_lens,
                          self.decoupled)

    def scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits as the behaviour policy sampled from them: divided by the temperature
        (greedy samples, temperature 0, report plain softmax log-probabilities)."""
        t = self.temperature
        return logits if t in (0.0, 1.0) else logits / t


def build_micro_batch(samples: Sequence[ScoredSample], *, pad_id: int,
                      config: GRPOConfig | None = None, expected_group_size: int | None = None,
                      weight_version: int | None = None, pad_to_multiple: int = 1,
                      max_staleness: int = 0) -> MicroBatch:
    """Pad samples (prompt + output) to one [B, T] batch and compute their advantages.

    expected_group_size, when given, rejects a batch holding a partial group (its
    advantages would differ from the full group's). weight_version, when given, makes
    the batch strictly on-policy: a sample generated by any other version raises
    StaleSampleError. With max_staleness N >= 1 (bounded staleness) every output token's
    version must lie in [weight_version - N, weight_version] instead, and the batch is
    trained with the decoupled objective. pad_to_multiple rounds T up so kernels see few
    distinct shapes. Every sample must have been drawn at the same temperature.
    """
    if not samples:
        raise ValueError("build_micro_batch needs at least one sample")
    if pad_to_multiple < 1:
        raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
    if max_staleness:
        if weight_version is None:
            raise ValueError("max_staleness needs the step's weight_version")
        for s in samples:
            check_within(s.changes, len(s.output_ids), weight_version, max_staleness, sample_id=s.sample_id)
    elif weight_version is not None:
        stale = [(s.sample_id, s.weight_version) for s in samples
                 if s.weight_version != weight_version]
        if stale:
            raise StaleSampleError(f"{len(stale)} samples are not from weight version "
                                   f"{weight_version}; (sample, version): {stale[:5]}")
    temperatures = sorted({s.temperature for s in samples})
    if len(temperatures) > 1:
        raise ValueError(f"samples of one micro-batch must share one sampling temperature, got "
                         f"{temperatures}; batch them separately")
    config = config or GRPOConfig()
    group_ids = torch.tensor([s.group_id for s in samples], dtype=torch.int64)
    if expected_group_size is not None:
        _check_group_sizes(group_ids, expected_group_size)
    width = max(s.num_tokens for s in samples)
    width = -(-width // pad_to_multiple) * pad_to_multiple
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((n, width), dtype=torch.int64)
    response_mask = torch.zeros((n, width), dtype=torch.bool)
    old_logprobs = torch.zeros((n, width), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, total = len(s.prompt_ids), s.num_tokens
        input_ids[row, :p] = torch.tensor(s.prompt_ids, dtype=torch.int64)
        input_ids[row, p:total] = torch.tensor(s.output_ids, dtype=torch.int64)
        attention_mask[row, :total] = 1
        if s.model_mask:
            mask = torch.tensor(s.model_mask, dtype=torch.bool)
            response_mask[row, p:total] = mask
            old_logprobs[row, p:total] = torch.tensor(s.output_logprobs, dtype=torch.float32) * mask
        else:
            response_mask[row, p:total] = True
            old_logprobs[row, p:total] = torch.tensor(s.output_logprobs, dtype=torch.float32)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    advantages = group_advantages(rewards, group_ids, normalize_std=config.normalize_std,
                                  eps=config.std_eps)
    return MicroBatch(input_ids, attention_mask, response_mask, old_logprobs, advantages,
                      rewards, group_ids, tuple(s.sample_id for s in samples),
                      tuple(s.weight_version for s in samples), temperatures[0],
                      decoupled=bool(max_staleness))


def _check_group_sizes(group_ids: torch.Tensor, expected: int) -> None:
    ids, counts = torch.unique(group_ids, return_counts=True)
    bad = [(int(g), int(c)) for g, c in zip(ids, counts) if int(c) != expected]
    if bad:
        raise ValueError(f"groups must hold {expected} samples each; (group, count) "
                         f"off: {bad[:5]}")


def model_logits(model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
    """The model's logits [B, T, V] on the batch: rlboost's DecoderLM takes seq_lens for a
    packed batch; any other (a transformers causal LM) takes position ids that restart at
    every sample, from which transformers keeps attention inside each sample."""
    if isinstance(model, DecoderLM):
        return model(batch.input_ids, None if batch.packed else batch.attention_mask, seq_lens=batch.seq_lens)
    if batch.packed:
        positions = packed_positions(batch.seq_lens, batch.input_ids.device)
        return model(input_ids=batch.input_ids, position_ids=positions, use_cache=False).logits
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits


@torch.no_grad()
def reference_logprobs(ref_model: torch.nn.Module, batch: MicroBatch, chunk_bytes: int = 64 << 20) -> torch.Tensor:
    """Log-probs of the batch's response tokens under a frozen reference model (for KL), at the
    batch's sampling temperature like the policy's."""
    logits = batch.scaled(model_logits(ref_model, batch))
    return token_logprobs(logits, batch.input_ids, batch.response_mask, chunk_bytes=chunk_bytes)


def micro_batch_loss(model: torch.nn.Module, batch: MicroBatch, config: GRPOConfig,
                     denominator: float | None = None,
                     ref_logprobs: torch.Tensor | None = None, *, chunk_bytes: int = 64 << 20) -> GRPOLoss:
    """Forward the model on a micro-batch and return its GRPO loss (call .loss.backward()).

    The model's log-probabilities are taken at the batch's sampling temperature, the
    distribution the engine drew from and reported old_logprobs under.

    denominator: the whole step's token (token_mean) or sequence (seq_mean) count, summed
    over every micro-batch and rank (MicroBatch.denominator). Required once a process
    group is initialised: sharded gradients are summed over ranks (FSDPConfig's
    grad_reduction="sum") and over micro-batches, so a per-micro-batch mean would scale
    the gradient by ranks x micro-batches and change what max_grad_norm clips.
    chunk_bytes bounds the float32 logits the log-probs compute at once (grpo.token_logprobs).
    """
    if denominator is None and dist.is_available() and dist.is_initialized():
        raise ValueError("denominator: pass the step's total count (sum of MicroBatch.denominator over "
                         "all micro-batches and ranks) when training under a process group")
    logits = batch.scaled(model_logits(model, batch))
    logprobs = token_logprobs(logits, batch.input_ids, batch.response_mask, chunk_bytes=chunk_bytes)
    loss = decoupled_loss if batch.decoupled else grpo_loss
    return loss(logprobs, batch.old_logprobs, batch.token_advantages(), batch.response_mask,
                config, ref_logprobs=ref_logprobs, denominator=denominator, seq_lens=batch.seq_lens)
