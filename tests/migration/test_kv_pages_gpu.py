"""The CUDA gather/scatter kernel agrees with the torch reference (needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from rlboost.migration.kv import KVLayout, gather_pages, gather_pages_batch, scatter_pages, scatter_pages_batch

from .test_kv_pages import reference_gather, reference_scatter

pytestmark = pytest.mark.gpu

LAYOUTS = [
    KVLayout(num_layers=4, num_kv_heads=8, head_dim=128, block_size=16, dtype="bfloat16"),
    KVLayout(num_layers=3, num_kv_heads=3, head_dim=5, block_size=7, dtype="float32"),  # unaligned rows
    KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, block_size=1, dtype="float16"),
]


def cuda_cache(layout: KVLayout, num_blocks: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layout.cache_shape(num_blocks), generator=g).to(layout.torch_dtype).cuda()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gather_on_device_matches_reference(layout):
    cache = cuda_cache(layout, 64)
    table = list(range(63, 0, -3)) + [5]
    n = (len(table) - 1) * layout.block_size + 1  # partial last block
    out = gather_pages(cache, layout, table, n)
    assert out.is_cuda
    assert torch.equal(out.cpu(), reference_gather(cache.cpu(), table, n))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gather_into_pinned_host_memory(layout):
    cache = cuda_cache(layout, 32)
    table = [31, 0, 7, 8, 9]
    n = 5 * layout.block_size - 2
    out = torch.empty(n * layout.token_bytes, dtype=torch.uint8).pin_memory()
    gather_pages(cache, layout, table, n, out=out)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(out, reference_gather(cache.cpu(), table, n))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scatter_on_device_from_device_and_pinned_data(layout):
    cache = cuda_cache(layout, 40, seed=1)
    table = [3, 9, 27, 1]
    n = 4 * layout.block_size - 1
    data = torch.randint(0, 256, (n * layout.token_bytes,), dtype=torch.uint8)
    expected = reference_scatter(cache.cpu(), table, n, data)
    scatter_pages(cache, layout, table, n, data.cuda())
    assert torch.equal(cache.cpu().view(torch.uint8), expected.view(torch.uint8))
    other = cuda_cache(layout, 40, seed=1)
    scatter_pages(other, layout, table, n, data.pin_memory())
    torch.cuda.synchronize()
    assert torch.equal(other.cpu().view(torch.uint8), expected.view(torch.uint8))


def test_batched_move_between_block_sizes_on_a_side_stream():
    src_layout = LAYOUTS[0]
    dst_layout = KVLayout(num_layers=4, num_kv_heads=8, head_dim=128, block_size=5, dtype="bfloat16")
    src = cuda_cache(src_layout, 128)
    dst = torch.zeros(dst_layout.cache_shape(300), dtype=torch.bfloat16, device="cuda")
    src_tables = [list(range(0, 40)), list(range(127, 100, -1)), [64]]
    tokens = [40 * 16 - 3, 27 * 16, 9]
    dst_tables = [list(range(0, 128)), list(range(128, 215)), [299, 298]]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        views = gather_pages_batch(src, src_layout, src_tables, tokens)
        scatter_pages_batch(dst, dst_layout, dst_tables, tokens, views)
    stream.synchronize()
    for st, dt, n in zip(src_tables, dst_tables, tokens):
        assert torch.equal(reference_gather(dst.cpu(), dt, n), reference_gather(src.cpu(), st, n))


def test_pageable_host_buffers_are_refused():
    layout = LAYOUTS[1]
    cache = cuda_cache(layout, 4)
    with pytest.raises(ValueError, match="pinned"):
        gather_pages(cache, layout, [0], 1, out=torch.empty(layout.token_bytes, dtype=torch.uint8))
