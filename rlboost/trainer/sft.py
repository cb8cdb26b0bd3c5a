"""Supervised warm-up: next-token loss on (prompt, completion) pairs, completion tokens only.

A short warm-up teaches a fresh tiny model the answer format and stopping, so GRPO's
group rewards differ from the first step on (all-zero groups carry no signal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class TokenizerLike(Protocol):
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class SFTBatch:
    """Right-padded [B, T] tensors; loss_mask is true on completion tokens and the end token."""

    input_ids: torch.Tensor       # int64
    attention_mask: torch.Tensor  # int64, 1 on real tokens
    loss_mask: torch.Tensor       # bool


def encode_prompt(tokenizer: TokenizerLike, prompt: str, *, add_bos: bool = True) -> list[int]:
    """Prompt ids as rollout and warm-up must both see them (BOS first when the tokenizer has one)."""
    bos = getattr(tokenizer, "bos_id", None)
    ids = list(tokenizer.encode(prompt))
    return [bos, *ids] if add_bos and bos is not None else ids


def build_sft_batch(pairs: Sequence[tuple[str, str]], tokenizer: TokenizerLike, *,
                    add_bos: bool = True) -> SFTBatch:
    """Tokenise prompt + completion + end token for each pair and pad to one batch."""
    if not pairs:
        raise ValueError("build_sft_batch needs at least one pair")
    rows = []
    for prompt, completion in pairs:
        p = encode_prompt(tokenizer, prompt, add_bos=add_bos)
        c = list(tokenizer.encode(completion)) + [tokenizer.eos_id]
        rows.append((p, c))
    width = max(len(p) + len(c) for p, c in rows)
    n = len(rows)
    input_ids = torch.full((n, width), tokenizer.pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((n, width), dtype=torch.int64)
    loss_mask = torch.zeros((n, width), dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        total = len(p) + len(c)
        input_ids[i, :total] = torch.tensor(p + c, dtype=torch.int64)
        attention_mask[i, :total] = 1
        loss_mask[i, len(p):total] = True
    return SFTBatch(input_ids, attention_mask, loss_mask)


def sft_loss(model: torch.nn.Module, batch: SFTBatch) -> torch.Tensor:
    """Mean negative log-likelihood of the completion tokens (including the end token)."""
    logits = model(batch.input_ids, batch.attention_mask)[:, :-1].float()
    targets = batch.input_ids[:, 1:]
    mask = batch.loss_mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                            targets.reshape(-1), reduction="none")
    return (nll * mask.reshape(-1)).sum() / mask.sum().clamp(min=1)
