"""Native gather/scatter of a sample's KV-cache pages (the layout: rlboost.migration.layout).

The paged cache every engine in rlboost uses for migration is one contiguous tensor
shaped [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] (2 = key, value).
A sample owns a list of block ids (its block table); its first `kv_tokens` token slots
across those blocks hold valid K/V. Gathered pages are ordered
[layer][k/v][token][kv_head][head_dim], so engines with other block sizes can take them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rlboost import _C
from rlboost.migration.layout import KVLayout
from rlboost.transfer.descriptors import HOST_DEVICE, describe_on_device, require_writable

BlockIds = Sequence[int] | np.ndarray | torch.Tensor


def gather_pages(cache: torch.Tensor, layout: KVLayout, block_ids: BlockIds, kv_tokens: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy the first kv_tokens token slots of a sample's blocks into one byte buffer.

    Returns `out` (or a new tensor on the cache's device): 1-D uint8 of exactly
    kv_tokens * layout.token_bytes bytes. With a CUDA cache, `out` may also be pinned host
    memory; the copy is then enqueued on the current stream (like any torch op).

    >>> layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=2, block_size=2, dtype="float32")
    >>> cache = torch.arange(16, dtype=torch.float32).reshape(layout.cache_shape(2))
    >>> gather_pages(cache, layout, [1, 0], 3).view(torch.float32).tolist()
    [4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 12.0, 13.0, 14.0, 15.0, 8.0, 9.0]
    """
    (view,) = gather_pages_batch(cache, layout, [block_ids], [kv_tokens], out=out)
    return out if out is not None else view


def scatter_pages(cache: torch.Tensor, layout: KVLayout, block_ids: BlockIds, kv_tokens: int,
                  data: torch.Tensor) -> None:
    """Write a buffer made by `gather_pages` (from any block size) into this cache's blocks.

    With a CUDA cache, `data` may be on the same device or in pinned host memory; the copy
    is enqueued on the current stream, so keep `data` unchanged until the stream reaches it.
    """
    scatter_pages_batch(cache, layout, [block_ids], [kv_tokens], [data])


def gather_pages_batch(cache: torch.Tensor, layout: KVLayout, block_tables: Sequence[BlockIds],
                       kv_tokens: Sequence[int], out: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Gather many samples in one native call; returns one view of `out` per sample.

    `out` (1-D uint8, sum(kv_tokens) * token_bytes bytes) holds the samples back to back.
    """
    num_blocks = _check_cache(cache, layout)
    ids, rows = _block_tables(block_tables, kv_tokens, layout, num_blocks)
    sizes = [n * layout.token_bytes for n in rows[:, 2].tolist()]
    if out is None:
        out = torch.empty(sum(sizes), dtype=torch.uint8, device=cache.device)
    _check_bytes(out, sum(sizes), cache, "out")
    require_writable(out, "out")
    views = tuple(out.split(sizes)) if sizes else ()
    _copy(False, cache, layout, num_blocks, ids, rows, views, out.device)
    return views


def scatter_pages_batch(cache: torch.Tensor, layout: KVLayout, block_tables: Sequence[BlockIds],
                        kv_tokens: Sequence[int], data: Sequence[torch.Tensor]) -> None:
    """Scatter many samples in one native call; no block may receive two samples' pages."""
    num_blocks = _check_cache(cache, layout)
    require_writable(cache, "cache")
    ids, rows = _block_tables(block_tables, kv_tokens, layout, num_blocks)
    data = tuple(data)
    if len(data) != len(rows):
        raise ValueError(f"data has {len(data)} buffers for {len(rows)} block tables")
    for i, d in enumerate(data):
        _check_bytes(d, int(rows[i, 2]) * layout.token_bytes, cache, f"data[{i}]")
    devices = {d.device for d in data}
    if len(devices) > 1:
        raise ValueError(f"data buffers are on several devices: {sorted(map(str, devices))}")
    _copy(True, cache, layout, num_blocks, ids, rows, data, devices.pop() if devices else cache.device)


def _check_cache(cache: torch.Tensor, layout: KVLayout) -> int:
    """Validate a paged cache against the layout; returns its number of blocks."""
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"cache must be a torch.Tensor, got {type(cache).__name__}")
    if cache.dim() != 6 or tuple(cache.shape) != layout.cache_shape(cache.shape[2]):
        raise ValueError(f"cache shape {tuple(cache.shape)} does not match the layout "
                         f"{layout.cache_shape(-1)} (-1 = num_blocks)")
    if cache.dtype != layout.torch_dtype:
        raise ValueError(f"cache dtype {cache.dtype} does not match the layout's {layout.dtype}")
    if not cache.is_contiguous():
        raise ValueError("cache must be contiguous")
    if cache.shape[2] < 1:
        raise ValueError("cache has no blocks")
    return cache.shape[2]


def _block_tables(tables: Sequence[BlockIds], kv_tokens: Sequence[int], layout: KVLayout,
                  num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated int64 block ids and int64 rows (offset, length, kv_tokens, addr, nbytes)."""
    tables, kv_tokens = list(tables), list(kv_tokens)
    if len(tables) != len(kv_tokens):
        raise ValueError(f"{len(tables)} block tables but {len(kv_tokens)} kv_tokens values")
    arrays = [_ids(t) for t in tables]
    rows = np.zeros((len(arrays), 5), dtype=np.int64)
    offset = 0
    for i, (ids, n) in enumerate(zip(arrays, kv_tokens)):
        n = _as_count(n, i)
        if n > len(ids) * layout.block_size:
            raise ValueError(f"kv_tokens[{i}] = {n} exceeds {len(ids)} blocks of {layout.block_size} tokens")
        if len(ids) and (ids.min() < 0 or ids.max() >= num_blocks):
            raise ValueError(f"block table {i} has ids outside [0, {num_blocks})")
        rows[i, :3] = (offset, len(ids), n)
        offset += len(ids)
    ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    return np.ascontiguousarray(ids, dtype=np.int64), rows


def _as_count(n, index: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"kv_tokens[{index}] must be an int >= 0, got {n!r}")
    return int(n)


def _ids(table: BlockIds) -> np.ndarray:
    if isinstance(table, torch.Tensor):
        table = table.detach().cpu().numpy()
    ids = np.asarray(table)
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"a block table must be a 1-D sequence of ints, got {ids.dtype} with shape {ids.shape}")
    return ids.astype(np.int64, copy=False)


def _check_bytes(t: torch.Tensor, nbytes: int, cache: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D torch.uint8 tensor")
    if t.numel() != nbytes:
        raise ValueError(f"{name} holds {t.numel()} bytes, expected {nbytes}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if cache.device.type == "cpu" and t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device} but the cache is in host memory")
    if cache.device.type == "cuda" and t.device != cache.device and not (t.device.type == "cpu" and t.is_pinned()):
        raise ValueError(f"{name} must be on {cache.device} or in pinned host memory, got {t.device}")


def _copy(scatter: bool, cache: torch.Tensor, layout: KVLayout, num_blocks: int, ids: np.ndarray,
          rows: np.ndarray, buffers: Sequence[torch.Tensor], data_device: torch.device) -> None:
    for i, b in enumerate(buffers):
        rows[i, 3], rows[i, 4], _ = describe_on_device(b)
    cache_addr, cache_nbytes, cache_dev = describe_on_device(cache)
    stream = torch.cuda.current_stream(cache.device).cuda_stream if cache.is_cuda else 0
    row_bytes = layout.num_kv_heads * layout.head_dim * layout.itemsize
    _C.migration.copy_pages(
        scatter, cache_addr, cache_nbytes, cache_dev, (layout.num_layers, num_blocks, layout.block_size, row_bytes),
        ids, rows, HOST_DEVICE if data_device.type == "cpu" else data_device.index, stream)
