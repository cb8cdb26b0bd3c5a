"""A micro-batch of complete groups -> each rank's forward passes: rows dealt over the ranks,
then cut by a token budget per forward, padded or packed.

Advantages are computed over complete groups before this split (batch.build_micro_batch),
and each forward's loss is a sum that the step's denominator divides once at the end
(rank.finish_step), so how rows are split changes neither the loss nor its gradient.
Every rank runs the same number of forwards (FSDP's collectives pair up across ranks):
a rank with fewer gets forwards with no response token, whose loss and gradient are 0.
"""

from __future__ import annotations

import torch

from rlboost.trainer.batch import MicroBatch


def deal_rows(batch: MicroBatch, parts: int) -> list[list[int]]:
    """Rows of a padded batch dealt over `parts` ranks, longest first, so each rank gets a
    similar token count."""
    lengths = batch.attention_mask.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    return [order[k::parts] for k in range(parts)]


def budget_bins(rows: list[int], lengths: list[int], max_tokens: int | None, *, packed: bool) -> list[list[int]]:
    """Rows (longest first) cut into forwards of at most max_tokens tokens each: the sum of
    lengths when packed, rows x the longest row when padded. A row longer than the budget
    is a forward of its own. None: one forward holds every row."""
    if not rows:
        return []
    if max_tokens is None:
        return [list(rows)]
    rows = sorted(rows, key=lambda r: -lengths[r])
    if not packed:  # longest first: a forward's width is its first row's length
        bins: list[list[int]] = []
        for r in rows:
            if bins and (len(bins[-1]) + 1) * lengths[bins[-1][0]] <= max_tokens:
                bins[-1].append(r)
            else:
                bins.append([r])
        return bins
    bins, used = [], []
    for r in rows:  # first fit, longest first
        for i, total in enumerate(used):
            if total + lengths[r] <= max_tokens:
                bins[i].append(r)
                used[i] += lengths[r]
                break
        else:
            bins.append([r])
            used.append(lengths[r])
    return bins


def split_for_ranks(batch: MicroBatch, parts: int, *, max_tokens: int | None = None,
                    packed: bool = False) -> list[list[MicroBatch]]:
    """Each rank's forwards (the same count on every rank), in the order they run."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    bins = [budget_bins(rows, lengths, max_tokens, packed=packed) for rows in deal_rows(batch, parts)]
    count = max(1, max(len(b) for b in bins))
    make = pack_rows if packed else pad_rows
    return [[make(batch, rows) for rows in rank_bins] + [empty_like(batch, packed=packed)] * (count - len(rank_bins))
            for rank_bins in bins]


def pad_rows(batch: MicroBatch, rows: list[int]) -> MicroBatch:
    """The rows as a padded batch trimmed to its own longest row."""
    idx = torch.tensor(rows, dtype=torch.long)
    width = int(batch.attention_mask[idx].sum(dim=1).max())
    pick = lambda t: t[idx, :width].contiguous()  # noqa: E731
    return MicroBatch(pick(batch.input_ids), pick(batch.attention_mask), pick(batch.response_mask),
                      pick(batch.old_logprobs), batch.advantages[idx].contiguous(),
                      batch.rewards[idx].contiguous(), batch.group_ids[idx].contiguous(),
                      tuple(batch.sample_ids[i] for i in rows),
                      tuple(batch.weight_versions[i] for i in rows), batch.temperature,
                      decoupled=batch.decoupled)


def pack_rows(batch: MicroBatch, rows: list[int]) -> MicroBatch:
    """The rows of a padded batch laid end to end in one row [1, N], without padding."""
    if batch.packed:
        raise ValueError("pack_rows takes a padded batch")
    lens = [int(batch.attention_mask[r].sum()) for r in rows]
    cat = lambda t: torch.cat([t[r, :n] for r, n in zip(rows, lens)])[None]  # noqa: E731
    idx = torch.tensor(rows, dtype=torch.long)
    return MicroBatch(cat(batch.input_ids), torch.ones(1, sum(lens), dtype=batch.attention_mask.dtype),
                      cat(batch.response_mask), cat(batch.old_logprobs), batch.advantages[idx].contiguous(),
                      batch.rewards[idx].contiguous(), batch.group_ids[idx].contiguous(),
                      tuple(batch.sample_ids[i] for i in rows), tuple(batch.weight_versions[i] for i in rows),
                      batch.temperature, seq_lens=tuple(lens), decoupled=batch.decoupled)


def empty_like(batch: MicroBatch, *, packed: bool = False) -> MicroBatch:
    """A two-token forward with no response token (loss and gradient 0), for a rank with
    fewer forwards than another: FSDP's collectives must pair up."""
    ids = batch.input_ids[:1, :2].clone()
    return MicroBatch(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool),
                      torch.zeros(ids.shape, dtype=torch.float32), torch.zeros(1), torch.zeros(1),
                      batch.group_ids[:1].clone(), (), (), batch.temperature,
                      seq_lens=(2,) if packed else None, decoupled=batch.decoupled)
