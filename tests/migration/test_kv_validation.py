"""Bad gather/scatter inputs raise ValueError before any memory is touched."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from rlboost import _C
from rlboost.migration.kv import KVLayout, gather_pages, gather_pages_batch, scatter_pages, scatter_pages_batch

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype="float16")
NUM_BLOCKS = 6


@pytest.fixture
def cache() -> torch.Tensor:
    return torch.randn(LAYOUT.cache_shape(NUM_BLOCKS)).to(torch.float16)


def data_for(n: int) -> torch.Tensor:
    return torch.ones(n * LAYOUT.token_bytes, dtype=torch.uint8)


@pytest.mark.parametrize("make_cache, match", [
    (lambda: torch.zeros(2, 2, 6, 4, 2), "shape"),
    (lambda: torch.zeros(2, 2, 6, 8, 2, 4, dtype=torch.float16), "shape"),
    (lambda: torch.zeros(3, 2, 6, 4, 2, 4, dtype=torch.float16), "shape"),
    (lambda: torch.zeros(LAYOUT.cache_shape(6)), "dtype"),
    (lambda: torch.zeros(2, 2, 6, 4, 4, 2, dtype=torch.float16).transpose(4, 5), "contiguous"),
    (lambda: torch.zeros(LAYOUT.cache_shape(0), dtype=torch.float16), "no blocks"),
    (lambda: np.zeros(LAYOUT.cache_shape(6), dtype=np.float16), "torch.Tensor"),
])
def test_bad_cache(make_cache, match):
    with pytest.raises(ValueError, match=match):
        gather_pages(make_cache(), LAYOUT, [0], 1)


@pytest.mark.parametrize("table, n, match", [
    ([0, 6], 5, r"outside \[0, 6\)"),
    ([-1], 1, r"outside \[0, 6\)"),
    ([0, 1], 9, "exceeds 2 blocks of 4"),
    ([0, 1], 10**15, "exceeds 2 blocks of 4"),  # refused before any output is allocated
    ([], 1, "exceeds 0 blocks"),
    ([0], -1, "kv_tokens"),
    ([0], 1.0, "kv_tokens"),
    ([0.0, 1.0], 1, "1-D sequence of ints"),
    ([[0, 1]], 1, "1-D sequence of ints"),
])
def test_bad_block_tables(cache, table, n, match):
    with pytest.raises(ValueError, match=match):
        gather_pages(cache, LAYOUT, table, n)
    before = cache.clone()
    with pytest.raises(ValueError, match=match):
        scatter_pages(cache, LAYOUT, table, n, data_for(1))
    assert torch.equal(cache, before)


@pytest.mark.parametrize("out, match", [
    (torch.empty(3 * LAYOUT.token_bytes + 1, dtype=torch.uint8), "expected"),
    (torch.empty(3 * LAYOUT.token_bytes // 2, dtype=torch.float16), "uint8"),
    (torch.empty(3, LAYOUT.token_bytes, dtype=torch.uint8), "1-D"),
    (torch.empty(6 * LAYOUT.token_bytes, dtype=torch.uint8)[::2], "contiguous"),
])
def test_bad_out(cache, out, match):
    with pytest.raises(ValueError, match=match):
        gather_pages(cache, LAYOUT, [1], 3, out=out)


def test_bad_scatter_data_leaves_the_cache_untouched(cache):
    before = cache.clone()
    with pytest.raises(ValueError, match="expected"):
        scatter_pages(cache, LAYOUT, [1, 2], 5, data_for(4))
    # The first sample is valid, the second is not: nothing at all is written.
    with pytest.raises(ValueError, match=r"data\[1\]"):
        scatter_pages_batch(cache, LAYOUT, [[0], [1]], [2, 2], [data_for(2), data_for(3)])
    with pytest.raises(ValueError, match="written twice"):
        scatter_pages_batch(cache, LAYOUT, [[0, 3], [3]], [5, 1], [data_for(5), data_for(1)])
    with pytest.raises(ValueError, match="3 block tables"):
        scatter_pages_batch(cache, LAYOUT, [[0], [1], [2]], [1, 1, 1], [data_for(1)])
    assert torch.equal(cache, before)


def test_unused_blocks_may_repeat_in_scatter(cache):
    # Only the first ceil(kv_tokens / block_size) blocks receive pages.
    scatter_pages_batch(cache, LAYOUT, [[0, 5], [5]], [4, 1], [data_for(4), data_for(1)])
    assert torch.equal(gather_pages(cache, LAYOUT, [5], 1), data_for(1))


def test_batch_needs_matching_lengths(cache):
    with pytest.raises(ValueError, match="2 block tables but 1"):
        gather_pages_batch(cache, LAYOUT, [[0], [1]], [1])


def _rows(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 5)


def test_native_checks_do_not_trust_the_caller(cache):
    """The native copier re-checks everything the Python layer already checked."""
    addr, nbytes = cache.data_ptr(), cache.numel() * 2
    row_bytes = LAYOUT.num_kv_heads * LAYOUT.head_dim * 2
    geometry = (LAYOUT.num_layers, NUM_BLOCKS, LAYOUT.block_size, row_bytes)
    out = data_for(4)
    ids = np.array([0, 1], dtype=np.int64)
    good = (0, 2, 4, out.data_ptr(), out.numel())
    copy = _C.migration.copy_pages
    copy(False, addr, nbytes, -1, geometry, ids, _rows(good), -1, 0)  # sanity: valid call works
    bad = [
        dict(cache_nbytes=nbytes - 1, match="layout needs"),
        dict(geometry=(0, NUM_BLOCKS, 4, row_bytes), match=">= 1|\\[1, 2\\*\\*40\\]"),
        dict(ids=np.array([0, 9], dtype=np.int64), match="outside"),
        dict(rows=_rows((1, 2, 4, out.data_ptr(), out.numel())), match="outside the block id array"),
        dict(rows=_rows((0, 2, 9, out.data_ptr(), out.numel())), match="exceeds"),
        dict(rows=_rows((0, 2, 4, out.data_ptr(), out.numel() - 1)), match="needs"),
        dict(rows=_rows((0, 2, 4, 0, out.numel())), match="null"),
        dict(rows=_rows((0, 2, 4, addr + 8, out.numel())), match="overlaps the cache"),
        dict(data_device=0, match="host cache"),
        dict(rows=np.zeros(3, dtype=np.int64), match="whole int64"),
    ]
    for case in bad:
        args = dict(cache_nbytes=nbytes, geometry=geometry, ids=ids, rows=_rows(good), data_device=-1)
        match = case.pop("match")
        args.update(case)
        with pytest.raises(ValueError, match=match):
            copy(False, addr, args["cache_nbytes"], -1, args["geometry"], args["ids"], args["rows"],
                 args["data_device"], 0)


def _read_only_like(t: torch.Tensor, tmp_path) -> torch.Tensor:
    """A tensor with t's bytes in a read-only file mapping (a native write there would fault)."""
    path = tmp_path / "ro.bin"
    path.write_bytes(t.contiguous().view(torch.uint8).numpy().tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns on non-writable arrays
        raw = torch.from_numpy(np.memmap(path, mode="r", dtype=np.uint8))
    return raw.view(t.dtype).view(t.shape)


def test_gather_into_read_only_out_raises_naming_out(cache, tmp_path):
    out = _read_only_like(torch.zeros(3 * LAYOUT.token_bytes, dtype=torch.uint8), tmp_path)
    with pytest.raises(ValueError, match="out"):
        gather_pages(cache, LAYOUT, [0], 3, out=out)


def test_scatter_into_read_only_cache_raises_naming_cache(cache, tmp_path):
    ro = _read_only_like(cache, tmp_path)
    with pytest.raises(ValueError, match="cache"):
        scatter_pages(ro, LAYOUT, [0], 3, data_for(3))
    # Gathering from a read-only cache only reads it, so it stays allowed.
    assert torch.equal(gather_pages(ro, LAYOUT, [0], 3), gather_pages(cache, LAYOUT, [0], 3))
