"""Building blocks of the decoder (RMSNorm, rotary embedding, GQA attention projections,
SwiGLU MLP), shared by the trainer's padded-batch forward and the rollout engine's paged
forward so both compute the same function with the same parameter names as HF.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rlboost.models.config import ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm in float32; divides by sqrt (both correctly rounded) so a row's result never
    depends on which other rows share the call."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies (float32) as HF computes them, with linear or llama3 scaling."""
    dim = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind, s = config.rope_type, config.rope_scaling or {}
    if kind == "linear":
        return inv / float(s["factor"])
    if kind == "llama3":
        factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_len = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return torch.where(medium, smoothed, scaled)
    return inv


class RotaryEmbedding(nn.Module):
    """cos/sin tables indexed by position, grown on demand on the device asked for.

    The angle is the float32 product HF forms; cos/sin of it are taken in float64 and
    rounded once, so a table entry is the same whichever kernel path (or regrowth)
    computed it. The tables are plain attributes, not buffers, so `model.to(bfloat16)`
    never degrades them and state dicts never carry them.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.inv_freq = rope_inv_freq(config)
        self._cos = self._sin = None

    def _grow(self, length: int, device: torch.device) -> None:
        size = max(64, 1 << (length - 1).bit_length())
        pos = torch.arange(size, device=device, dtype=torch.float32)
        angles = pos[:, None] * self.inv_freq.to(device)[None, :]
        angles = torch.cat([angles, angles], dim=-1).double()
        self._cos, self._sin = angles.cos().float(), angles.sin().float()

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin shaped positions.shape + [head_dim]."""
        needed = int(positions.max()) + 1 if positions.numel() else 1
        if self._cos is None or self._cos.shape[0] < needed or self._cos.device != positions.device:
            self._grow(needed, positions.device)
        return self._cos[positions].to(dtype), self._sin[positions].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x[..., heads, head_dim] by per-token cos/sin[..., head_dim] (HF's rotate_half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


class Attention(nn.Module):
    """GQA projections. The attention itself is done by the caller (dense in DecoderLM,
    paged in the rollout engine)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.scale = c.head_dim ** -0.5

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x[..., hidden] -> q[..., heads, head_dim], k and v[..., kv_heads, head_dim], RoPE applied."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block; `attend(q, k, v)` is supplied by the caller."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        q, k, v = self.self_attn.project(self.input_layernorm(h), cos, sin)
        h = h + self.self_attn.o_proj(attend(q, k, v))
        return h + self.mlp(self.post_attention_layernorm(h))
