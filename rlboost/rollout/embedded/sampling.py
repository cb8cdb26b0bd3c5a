"""Deterministic token sampling: greedy, temperature, top-k, top-p.

Token t of a sample is drawn by Gumbel-max with noise from a counter-based hash of
(seed, sample_id, t, vocabulary index), computed in integer arithmetic on any device, so a
sample produces the same tokens whatever batch it shares and whichever engine resumes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M64 = (1 << 64) - 1
_M32 = 0xFFFFFFFF
_MIX = 0x045D9F3B      # odd and < 2**31: a 32-bit value times it stays inside int64
_GOLDEN = 0x9E3779B1   # odd: v -> v * _GOLDEN mod 2**32 is a bijection


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def draw_key(seed: int, sample_id: int, t: int) -> int:
    """64-bit key of the draw for output token t of a sample."""
    return _splitmix64(_splitmix64(_splitmix64(t & _M64) ^ (sample_id & _M64)) ^ (seed & _M64))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # x holds values in [0, 2**32) in int64, so every shift is logical and every product fits.
    x = ((x >> 16) ^ x) * _MIX & _M32
    x = ((x >> 16) ^ x) * _MIX & _M32
    return (x >> 16) ^ x


def gumbel_noise(keys: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """Gumbel(0, 1) noise [len(keys), vocab_size] in float64, a pure function of the keys."""
    lo = torch.tensor([k & _M32 for k in keys], dtype=torch.int64, device=device)[:, None]
    hi = torch.tensor([k >> 32 for k in keys], dtype=torch.int64, device=device)[:, None]
    v = torch.arange(vocab_size, dtype=torch.int64, device=device)[None, :]
    h = _mix32(_mix32(((v * _GOLDEN) & _M32) ^ lo) ^ hi)
    u = (h.double() + 0.5) * (1.0 / 4294967296.0)
    return -torch.log(-torch.log(u))


@dataclass(frozen=True, slots=True)
class DrawSpec:
    """How to draw one token: the sample's sampling parameters and its draw key."""

    temperature: float
    top_k: int
    top_p: float
    key: int


def _filter_top_k_top_p(scaled: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set logits outside each row's top-k / nucleus to -inf (rows are independent)."""
    vocab = scaled.shape[-1]
    values, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.tensor([kk if 0 < kk < vocab else vocab for kk in top_k], device=scaled.device)[:, None]
    keep = rank < k
    p = torch.tensor(top_p, dtype=values.dtype, device=scaled.device)[:, None]
    probs = torch.softmax(values, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    keep &= (before < p) | (rank == 0)
    mask = torch.zeros_like(keep).scatter_(-1, order, keep)
    return scaled.masked_fill(~mask, float("-inf"))


def sample_tokens(logits: torch.Tensor, specs: list[DrawSpec]) -> tuple[list[int], list[float]]:
    """Draw one token per row of logits [B, V]; return ids and their logprobs.

    The logprob is that of the chosen token under softmax(logits / temperature) (plain
    softmax for greedy rows, temperature == 0), before top-k / top-p filtering.
    """
    logits = logits.float()
    temps = torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in specs],
                         dtype=torch.float32, device=logits.device)[:, None]
    scaled = logits / temps
    tokens = scaled.argmax(dim=-1)
    rows = [i for i, s in enumerate(specs) if s.temperature > 0]
    if rows:
        sub = scaled[rows]
        filtered = [i for i in rows if specs[i].top_k > 0 or specs[i].top_p < 1.0]
        if filtered:
            pos = [rows.index(i) for i in filtered]
            sub[pos] = _filter_top_k_top_p(sub[pos], [specs[i].top_k for i in filtered],
                                           [specs[i].top_p for i in filtered])
        noise = gumbel_noise([specs[i].key for i in rows], logits.shape[-1], logits.device)
        tokens[rows] = (sub.double() + noise).argmax(dim=-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None])[:, 0]
    return tokens.tolist(), logprobs.tolist()
