"""A small causal decoder with the Hugging Face module layout, for trainer tests only.

It stands in for rlboost.models.DecoderLM where only the layout matters
(model.model.layers, forward(input_ids, attention_mask) -> logits).
"""

from __future__ import annotations

import torch
from torch import nn


class _BlockForTests(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.input_layernorm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.post_attention_layernorm = nn.LayerNorm(hidden)
        self.up_proj = nn.Linear(hidden, 2 * hidden)
        self.down_proj = nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.input_layernorm(x)).chunk(3, dim=-1)
        split = lambda z: z.view(b, t, self.heads, h // self.heads).transpose(1, 2)
        att = torch.nn.functional.scaled_dot_product_attention(
            split(q), split(k), split(v), attn_mask=attn_bias)
        x = x + self.o_proj(att.transpose(1, 2).reshape(b, t, h))
        return x + self.down_proj(torch.nn.functional.gelu(self.up_proj(
            self.post_attention_layernorm(x))))


class _InnerForTests(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, heads: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(_BlockForTests(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)


class TinyDecoderForTests(nn.Module):
    def __init__(self, vocab: int = 67, hidden: int = 32, layers: int = 2, heads: int = 4):
        super().__init__()
        self.model = _InnerForTests(vocab, hidden, layers, heads)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        t = input_ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        allowed = causal[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        # Padding rows would attend to nothing; let them see themselves to stay finite.
        allowed = allowed | torch.eye(t, dtype=torch.bool)[None, None]
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, bias)
        return self.lm_head(self.model.norm(x))
