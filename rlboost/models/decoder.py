"""DecoderLM: a Llama / Qwen2 / Qwen3 causal language model whose parameter names are
exactly Hugging Face's, so HF checkpoints load as they are and the trainer's state dict is
what the rollout engine loads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlboost.models.config import ModelConfig
from rlboost.models.layers import DecoderLayer, RMSNorm, RotaryEmbedding
from rlboost.models.packed import check_packed, packed_attention, packed_positions


class DecoderBody(nn.Module):
    """The `model.` prefix of HF names: embeddings, layers, final norm, rotary tables."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class DecoderLM(nn.Module):
    """Causal LM. `forward(input_ids[B, T], attention_mask[B, T] | None) -> logits[B, T, V]`.

    >>> from rlboost.models.config import ModelConfig
    >>> m = DecoderLM(ModelConfig(arch="llama", vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    >>> m(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 32])

    Padding may be on either side: positions count only the real tokens (mask 1), masked
    keys are never attended to, and logits at padded positions are meaningless. A packed
    batch (`seq_lens=`) holds samples end to end in one row, without padding. With
    tie_word_embeddings, `lm_head.weight` is the embedding matrix itself.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # trainer.activation_checkpointing: recompute each decoder layer in backward (not a
        # parameter or buffer, so checkpoints and the weights' names stay as they are)
        self.activation_checkpointing = False
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                seq_lens: Sequence[int] | None = None) -> torch.Tensor:
        return self.lm_head(self.hidden_states(input_ids, attention_mask, seq_lens=seq_lens))

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                      seq_lens: Sequence[int] | None = None) -> torch.Tensor:
        """Final-norm hidden states [B, T, hidden] (for losses that apply lm_head in chunks).

        seq_lens: input_ids is one packed row [1, N] of samples of these lengths (no padding,
        no attention_mask): positions restart at each sample and attention stays inside it."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        gqa = self.config.num_query_groups > 1
        if seq_lens is not None:
            if attention_mask is not None:
                raise ValueError("a packed batch (seq_lens) has no padding: pass attention_mask=None")
            check_packed(input_ids, seq_lens)
            positions, attend = packed_positions(seq_lens, input_ids.device), packed_attention(seq_lens, gqa=gqa)
        else:
            positions, attend = self._padded(input_ids, attention_mask, gqa)
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary_emb(positions, h.dtype)
        keep_all = not (self.activation_checkpointing and torch.is_grad_enabled())
        for layer in self.model.layers:
            if keep_all:
                h = layer(h, cos, sin, attend)
            else:  # keep the layer's input only; its activations are recomputed in backward
                h = checkpoint(layer, h, cos, sin, attend, use_reentrant=False)
        return self.model.norm(h)

    @staticmethod
    def _padded(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, gqa: bool):
        """Positions and attend() of a padded batch: causal attention over real tokens only."""
        batch, seq = input_ids.shape
        device = input_ids.device
        causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
        if attention_mask is None:
            positions = torch.arange(seq, device=device).expand(batch, seq)
            mask = causal.expand(batch, 1, seq, seq)
        else:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != "
                                 f"input_ids shape {tuple(input_ids.shape)}")
            keep = attention_mask.to(torch.bool)
            positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
            # A padded query still attends to itself, so no softmax row is empty (no NaN).
            eye = torch.eye(seq, dtype=torch.bool, device=device)
            mask = ((causal & keep[:, None, :]) | eye)[:, None]

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, D]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            return out.transpose(1, 2).reshape(batch, seq, -1)

        return positions, attend

    def named_weights(self) -> dict[str, torch.Tensor]:
        """HF-named tensors as a checkpoint stores them (the tied lm_head left out)."""
        out = dict(self.state_dict())
        if self.config.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        return out
