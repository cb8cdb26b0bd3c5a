"""Attention over packed sequences: samples laid end to end in one row, without padding, each
attending only to itself (causally), with positions that restart at every sample.

On a CUDA device with a varlen kernel (flash-attn's flash_attn_varlen_func) the whole row is one
call; elsewhere each sample is its own causal SDPA call, which costs what the samples'
own lengths cost, never the padded width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def packed_positions(seq_lens: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """Position ids [1, N] that restart at 0 for every sample."""
    return torch.cat([torch.arange(n, device=device) for n in seq_lens])[None]


def check_packed(input_ids: torch.Tensor, seq_lens: Sequence[int]) -> None:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"packed input_ids must be [1, tokens], got shape {tuple(input_ids.shape)}")
    if not seq_lens or min(seq_lens) < 1 or sum(seq_lens) != input_ids.shape[1]:
        raise ValueError(f"seq_lens must be positive and sum to {input_ids.shape[1]} tokens, "
                         f"got {len(seq_lens)} lengths summing to {sum(seq_lens)}")


def _flash_varlen():
    """flash-attn's varlen kernel, or None where it is not installed."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def packed_attention(seq_lens: Sequence[int], *, gqa: bool, varlen: bool = True):
    """attend(q, k, v) for q [1, N, heads, D] and k, v [1, N, kv_heads, D] -> [1, N, heads * D].

    varlen=False keeps the per-sample loop even where a varlen kernel exists (for checks)."""
    spans, start = [], 0
    for n in seq_lens:
        spans.append((start, start + n))
        start += n
    lens = list(seq_lens)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kernel = _flash_varlen() if varlen and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else None
        if kernel is not None:
            cu = torch.tensor([0, *lens], device=q.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            out = kernel(q[0], k[0], v[0], cu, cu, max(lens), max(lens), causal=True)
            return out.reshape(1, start, -1)
        outs = []
        for a, b in spans:
            qs, ks, vs = (t[:, a:b].transpose(1, 2) for t in (q, k, v))  # [1, heads, n, D]
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=gqa).transpose(1, 2))
        return torch.cat(outs, dim=1).reshape(1, start, -1)

    return attend
