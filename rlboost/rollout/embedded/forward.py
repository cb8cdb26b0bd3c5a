"""One forward step of the embedded engine over the paged KV cache: decode tokens of many
samples and prefill chunks of others, packed into one flat batch of token rows.

Batch invariance (a sample's logits do not depend on who else is in the step, nor on
whether its prefix was decoded or re-prefilled) comes from fixed shapes, not luck:
- every matmul sees a row count padded to a multiple of ROW_TILE, so each row lands in a
  full kernel tile and is reduced in the same order whatever the row count;
- attention is per sample; keys are padded to a multiple of KEY_SEGMENT and values are
  reduced segment by segment with a fixed-size matmul, masked keys adding exact zeros;
  decodes attend in buckets of similar context length (a power-of-two number of
  segments), so one long sample does not make every short one read as many keys;
- RMSNorm divides by a square root and RoPE reads a fixed table (both exact per element).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlboost.models.decoder import DecoderLM
from rlboost.rollout.embedded.kv_cache import PagedKVCache

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


def decode_buckets(chunks: list[Chunk]) -> dict[int, list[int]]:
    """Indices of single-token chunks by the key width their bucket reads: the context
    rounded up to a power-of-two number of KEY_SEGMENTs (at most 2x the keys a sample
    needs, and log2(longest / KEY_SEGMENT) + 1 attention calls per layer).

    >>> decode_buckets([Chunk([1], 10, [], True), Chunk([1], 900, [], True), Chunk([1], 40, [], True)])
    {64: [0, 2], 1024: [1]}
    """
    out: dict[int, list[int]] = {}
    for i, c in enumerate(chunks):
        segments = -(-(c.start + 1) // KEY_SEGMENT)
        out.setdefault(KEY_SEGMENT << (segments - 1).bit_length(), []).append(i)
    return dict(sorted(out.items()))


class _Group:
    """Samples that attend together: all single-token decodes, or one prefill chunk.

    Holds what every layer reuses: the block table, and the additive mask (0 or -inf)
    over the padded query rows (n tokens x query groups, padded to full row tiles).
    """

    def __init__(self, chunks: list[Chunk], rows: list[int], cache: PagedKVCache, groups: int,
                 dtype: torch.dtype, device):
        self.rows = torch.tensor(rows, device=device)
        self.n_tokens = n = len(chunks[0].tokens)  # 1 for the decode group
        self.keys = _round_up(max(c.start + n for c in chunks), KEY_SEGMENT)
        self.width = -(-self.keys // cache.block_size)
        self.table = torch.tensor([c.blocks[:self.width] + [0] * (self.width - len(c.blocks[:self.width]))
                                   for c in chunks], dtype=torch.int64, device=device)
        self.m = _round_up(n * groups, ROW_TILE)
        qpos = torch.tensor([[c.start + i for i in range(n)] for c in chunks])      # [S, n]
        qpos = qpos.repeat_interleave(groups, dim=1)                                # [S, n*G]
        qpos = torch.cat([qpos, qpos[:, :1].expand(-1, self.m - n * groups)], dim=1)  # padded rows
        visible = torch.arange(self.keys)[None, None, :] <= qpos[:, :, None]        # [S, m, K]
        bias = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))
        self.bias = bias[:, None].to(device)                                        # [S, 1, m, K]

    def gather(self, blocks: torch.Tensor) -> torch.Tensor:
        """[num_blocks, block_size, kv_heads, D] -> each sample's first `keys` slots [S, K, kv_heads, D]."""
        out = blocks[self.table]
        out = out.view(out.shape[0], -1, *out.shape[-2:])
        return out if out.shape[1] == self.keys else out[:, :self.keys]


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
        dtype = self.cache.tensor.dtype
        groups = [_Group([decode[i] for i in idx], [rows_decode[i] for i in idx], self.cache, self.groups,
                         dtype, device) for idx in decode_buckets(decode).values()]
        groups += [_Group([c], rows, self.cache, self.groups, dtype, device) for c, rows in prefill]

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
        cache = self.cache
        cache.layer_slots(layer, 0).index_copy_(0, slots, k[:n])
        cache.layer_slots(layer, 1).index_copy_(0, slots, v[:n])
        keys, values = cache.tensor[layer, 0], cache.tensor[layer, 1]
        out = torch.zeros_like(q)
        for g in groups:
            out[g.rows] = self._attend_group(q[g.rows], g.gather(keys), g.gather(values), g)
        return out.view(q.shape[0], -1)

    def _attend_group(self, q, keys, values, g: _Group):
        """q [S*n, heads, D]; keys/values [S, K, kv_heads, D] -> [S*n, heads, D]."""
        samples, n, G, H, D, m = keys.shape[0], g.n_tokens, self.groups, self.kv_heads, self.head_dim, g.m
        # rows of one (sample, kv head): n tokens x G query heads, padded to full tiles
        q = q.view(samples, n, H, G, D).permute(0, 2, 1, 3, 4).reshape(samples, H, n * G, D)
        q = F.pad(q, (0, 0, 0, m - n * G))
        scores = torch.matmul(q, keys.permute(0, 2, 3, 1)) * self.scale + g.bias  # [S, H, m, K]
        probs = torch.softmax(scores, dim=-1)
        # P @ V one fixed-size key segment at a time, summed left to right (cumsum is a
        # sequential scan), so extra all-masked segments only ever add exact zeros.
        nseg = g.keys // KEY_SEGMENT
        probs = probs.view(samples, H, m, nseg, KEY_SEGMENT).transpose(2, 3)
        values = values.permute(0, 2, 1, 3).reshape(samples, H, nseg, KEY_SEGMENT, D)
        parts = torch.matmul(probs, values)                                # [S, H, nseg, m, D]
        out = parts[:, :, 0] if nseg == 1 else parts.cumsum(dim=2)[:, :, -1]
        out = out[:, :, :n * G].reshape(samples, H, n, G, D).permute(0, 2, 1, 3, 4)
        return out.reshape(samples * n, H * G, D)
