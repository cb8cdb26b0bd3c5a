"""One forward step of the embedded engine over the paged KV cache: decode tokens of many
samples and prefill chunks of others, packed into one flat batch of token rows.

Batch invariance (a sample's logits do not depend on who else is in the step, nor on
whether its prefix was decoded or re-prefilled) comes from fixed shapes, not luck:
- every matmul sees a row count padded to a multiple of ROW_TILE, so each row lands in a
  full kernel tile and is reduced in the same order whatever the row count;
- attention is per sample; keys are padded to a multiple of KEY_SEGMENT and values are
  reduced segment by segment with a fixed-size matmul, masked keys adding exact zeros;
- RMSNorm divides by a square root and RoPE reads a fixed table (both exact per element).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlboost.models.decoder import DecoderLM
from rlboost.rollout._paged_kv import PagedKVCache

ROW_TILE = 16
KEY_SEGMENT = 64


def _round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


@dataclass(slots=True)
class Chunk:
    """Tokens of one sample fed in this step, at positions start .. start+len(tokens)-1."""

    tokens: list[int]
    start: int
    blocks: list[int]
    wants_logits: bool  # True when the chunk ends at the sample's last known token


class _Group:
    """Samples that attend together: all single-token decodes, or one prefill chunk."""

    def __init__(self, chunks: list[Chunk], rows: list[int], cache: PagedKVCache, device):
        self.rows = torch.tensor(rows, device=device)
        self.n_tokens = len(chunks[0].tokens)  # 1 for the decode group
        ends = [c.start + len(c.tokens) for c in chunks]
        self.keys = _round_up(max(ends), KEY_SEGMENT)
        bs = cache.block_size
        width = -(-self.keys // bs)
        table = torch.tensor([c.blocks[:width] + [0] * (width - len(c.blocks[:width])) for c in chunks],
                             dtype=torch.int64)
        j = torch.arange(self.keys)
        self.slots = (table[:, j // bs] * bs + j % bs).to(device)           # [S, keys]
        # query position of each token row of each sample
        qpos = torch.tensor([[c.start + i for i in range(self.n_tokens)] for c in chunks])
        self.mask = (j[None, None, :] <= qpos[:, :, None]).to(device)       # [S, n, keys]


class PagedForward:
    """Runs DecoderLM's layers with attention read through each sample's block table."""

    def __init__(self, model: DecoderLM, cache: PagedKVCache):
        self.model = model
        self.cache = cache
        cfg = model.config
        self.groups = cfg.num_query_groups
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim ** -0.5

    @torch.inference_mode()
    def __call__(self, chunks: list[Chunk]) -> torch.Tensor:
        """Write K/V of every fed token and return logits [k, vocab] for the k chunks that
        want them, in chunk order."""
        device = self.cache.tensor.device
        ids, pos, slots, rows_decode, decode, prefill = [], [], [], [], [], []
        for c in chunks:
            first = len(ids)
            ids += c.tokens
            pos += range(c.start, c.start + len(c.tokens))
            slots += self.cache.slot_ids(c.blocks, c.start, c.start + len(c.tokens))
            if len(c.tokens) == 1:
                decode.append(c)
                rows_decode.append(first)
            else:
                prefill.append((c, list(range(first, len(ids)))))
        n = len(ids)
        padded = _round_up(n, ROW_TILE)
        ids_t = torch.tensor(ids + [0] * (padded - n), device=device)
        pos_t = torch.tensor(pos + [0] * (padded - n), device=device)
        slots_t = torch.tensor(slots, device=device)
        groups = [_Group(decode, rows_decode, self.cache, device)] if decode else []
        groups += [_Group([c], rows, self.cache, device) for c, rows in prefill]

        body = self.model.model
        h = body.embed_tokens(ids_t)
        cos, sin = body.rotary_emb(pos_t, h.dtype)
        for index, layer in enumerate(body.layers):
            def attend(q, k, v, layer_index=index):
                return self._attend(layer_index, q, k, v, n, slots_t, groups)
            h = layer(h, cos, sin, attend)

        last = []
        row = 0
        for c in chunks:
            row += len(c.tokens)
            if c.wants_logits:
                last.append(row - 1)
        picked = h[torch.tensor(last + [0] * (_round_up(len(last), ROW_TILE) - len(last)), device=device)]
        return self.model.lm_head(body.norm(picked))[:len(last)].float()

    def _attend(self, layer: int, q, k, v, n: int, slots: torch.Tensor, groups: list[_Group]):
        keys, values = self.cache.layer_slots(layer, 0), self.cache.layer_slots(layer, 1)
        keys.index_copy_(0, slots, k[:n])
        values.index_copy_(0, slots, v[:n])
        out = torch.zeros_like(q)
        for g in groups:
            out[g.rows] = self._attend_group(q[g.rows], keys[g.slots], values[g.slots], g)
        return out.view(q.shape[0], -1)

    def _attend_group(self, q, keys, values, g: _Group):
        """q [S*n, heads, D]; keys/values [S, K, kv_heads, D] -> [S*n, heads, D]."""
        samples, n, G, H, D = keys.shape[0], g.n_tokens, self.groups, self.kv_heads, self.head_dim
        # rows of one (sample, kv head): n tokens x G query heads, padded to full tiles
        q = q.view(samples, n, H, G, D).permute(0, 2, 1, 3, 4).reshape(samples, H, n * G, D)
        m = _round_up(n * G, ROW_TILE)
        q = F.pad(q, (0, 0, 0, m - n * G))
        mask = g.mask.repeat_interleave(G, dim=1)                          # [S, n*G, K]
        mask = torch.cat([mask, mask[:, :1].expand(samples, m - n * G, -1)], dim=1)
        scores = torch.matmul(q, keys.permute(0, 2, 3, 1)) * self.scale  # [S, H, m, K]
        probs = torch.softmax(scores.masked_fill(~mask[:, None], float("-inf")), dim=-1)
        # P @ V one fixed-size key segment at a time, summed left to right (cumsum is a
        # sequential scan), so extra all-masked segments only ever add exact zeros.
        nseg = g.keys // KEY_SEGMENT
        probs = probs.view(samples, H, m, nseg, KEY_SEGMENT).transpose(2, 3)
        values = values.permute(0, 2, 1, 3).reshape(samples, H, nseg, KEY_SEGMENT, D)
        parts = torch.matmul(probs, values)                                # [S, H, nseg, m, D]
        out = parts[:, :, 0] if nseg == 1 else parts.cumsum(dim=2)[:, :, -1]
        out = out[:, :, :n * G].reshape(samples, H, n, G, D).permute(0, 2, 1, 3, 4)
        return out.reshape(samples * n, H * G, D)
