"""KV page gather/scatter: equal to a pure-torch reference, round trips, engines with
different block sizes, batched calls, thread safety, and input validation."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.migration.kv import KVLayout, gather_pages, gather_pages_batch, scatter_pages, scatter_pages_batch

DTYPES = ["float32", "float16", "bfloat16"]


def reference_gather(cache: torch.Tensor, block_ids, kv_tokens: int) -> torch.Tensor:
    """index_select over token slots: [layer][k/v][token][head][dim] as bytes."""
    L, _, nb, bs, h, d = cache.shape
    slots = torch.tensor([block_ids[t // bs] * bs + t % bs for t in range(kv_tokens)], dtype=torch.long)
    picked = cache.reshape(L, 2, nb * bs, h, d).index_select(2, slots)
    return picked.contiguous().view(torch.uint8).reshape(-1)


def reference_scatter(cache: torch.Tensor, block_ids, kv_tokens: int, data: torch.Tensor) -> torch.Tensor:
    L, _, nb, bs, h, d = cache.shape
    slots = torch.tensor([block_ids[t // bs] * bs + t % bs for t in range(kv_tokens)], dtype=torch.long)
    out = cache.clone().reshape(L, 2, nb * bs, h, d)
    out.index_copy_(2, slots, data.view(cache.dtype).reshape(L, 2, kv_tokens, h, d))
    return out.reshape(cache.shape)


def random_cache(layout: KVLayout, num_blocks: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layout.cache_shape(num_blocks), generator=g).to(layout.torch_dtype)


layouts = st.builds(KVLayout, num_layers=st.integers(1, 3), num_kv_heads=st.integers(1, 3),
                    head_dim=st.integers(1, 16), block_size=st.integers(1, 9), dtype=st.sampled_from(DTYPES))


@st.composite
def cache_and_table(draw, distinct: bool = False):
    layout = draw(layouts)
    num_blocks = draw(st.integers(1, 12))
    ids = st.integers(0, num_blocks - 1)
    table = draw(st.lists(ids, max_size=num_blocks, unique=distinct))
    kv_tokens = draw(st.integers(0, len(table) * layout.block_size))  # often a partial last block
    return layout, num_blocks, table, kv_tokens


@settings(max_examples=150, deadline=None)
@given(cache_and_table(), st.sampled_from(["list", "numpy", "torch"]))
def test_gather_matches_torch_reference(case, table_kind):
    layout, num_blocks, table, n = case
    cache = random_cache(layout, num_blocks)
    ids = {"list": table, "numpy": np.array(table, dtype=np.int32), "torch": torch.tensor(table, dtype=torch.long)}
    out = gather_pages(cache, layout, ids[table_kind], n)
    assert out.dtype == torch.uint8 and out.numel() == n * layout.token_bytes
    assert torch.equal(out, reference_gather(cache, table, n))


@settings(max_examples=150, deadline=None)
@given(cache_and_table(distinct=True), st.integers(0, 2**31))
def test_scatter_matches_torch_reference_and_round_trips(case, seed):
    layout, num_blocks, table, n = case
    cache = random_cache(layout, num_blocks, seed)
    data = torch.randint(0, 256, (n * layout.token_bytes,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))
    expected = reference_scatter(cache, table, n, data)
    scatter_pages(cache, layout, table, n, data)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))  # other slots untouched
    assert torch.equal(gather_pages(cache, layout, table, n), data)


@settings(max_examples=100, deadline=None)
@given(layouts, st.integers(1, 9), st.integers(0, 40), st.randoms(use_true_random=False))
def test_pages_move_between_caches_with_different_block_sizes(layout, dst_block, n, rnd):
    dst_layout = KVLayout(num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
                          head_dim=layout.head_dim, block_size=dst_block, dtype=layout.dtype)
    src_blocks = -(-n // layout.block_size) + 3
    dst_blocks = -(-n // dst_block) + 2
    src_table = rnd.sample(range(src_blocks), src_blocks - 3)
    dst_table = rnd.sample(range(dst_blocks), dst_blocks - 2)
    src = random_cache(layout, src_blocks, seed=1)
    dst = random_cache(dst_layout, dst_blocks, seed=2)
    scatter_pages(dst, dst_layout, dst_table, n, gather_pages(src, layout, src_table, n))
    assert torch.equal(reference_gather(dst, dst_table, n), reference_gather(src, src_table, n))


def test_batched_calls_equal_single_calls():
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype="float16")
    cache = random_cache(layout, 32)
    tables = [[3, 1, 7], [], [30, 31], [0, 2, 4, 6, 8]]
    tokens = [9, 0, 8, 17]
    views = gather_pages_batch(cache, layout, tables, tokens)
    assert len(views) == 4
    for v, t, n in zip(views, tables, tokens):
        assert torch.equal(v, gather_pages(cache, layout, t, n))
    other = torch.zeros_like(cache)
    dst_tables = [[10, 11, 12], [], [13, 14], [15, 16, 17, 18, 19]]
    scatter_pages_batch(other, layout, dst_tables, tokens, views)
    for v, t, n in zip(views, dst_tables, tokens):
        assert torch.equal(gather_pages(other, layout, t, n), v)


def test_out_is_filled_in_place():
    layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, block_size=4, dtype="float32")
    cache = random_cache(layout, 8)
    out = torch.empty(6 * layout.token_bytes, dtype=torch.uint8)
    got = gather_pages(cache, layout, [5, 6], 6, out=out)
    assert got is out
    assert torch.equal(out, reference_gather(cache, [5, 6], 6))
    both = torch.empty(9 * layout.token_bytes, dtype=torch.uint8)
    views = gather_pages_batch(cache, layout, [[1], [2, 3]], [3, 6], out=both)
    assert views[0].data_ptr() == both.data_ptr()
    assert views[1].data_ptr() == both.data_ptr() + 3 * layout.token_bytes


@pytest.mark.parametrize("contiguous", [True, False])
def test_large_multithreaded_copies(contiguous):
    layout = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, block_size=16, dtype="bfloat16")
    cache = random_cache(layout, 256)
    table = list(range(40, 200)) if contiguous else list(range(255, 60, -1))[::1]
    n = len(table) * 16 - 5
    data = gather_pages(cache, layout, table, n)
    assert data.numel() > 8 << 20  # spans many thread-pool tasks
    assert torch.equal(data, reference_gather(cache, table, n))
    dst = torch.zeros_like(cache)
    scatter_pages(dst, layout, table, n, data)
    assert torch.equal(gather_pages(dst, layout, table, n), data)


@pytest.mark.parametrize("layout, num_blocks, used", [
    # Copies above 64 MiB bypass the cache with streaming stores; rows of 6 bytes leave
    # every destination unaligned, rows of 512 bytes leave them all aligned.
    (KVLayout(num_layers=8, num_kv_heads=1, head_dim=3, block_size=1000, dtype="float16"), 800, 760),
    (KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, block_size=16, dtype="bfloat16"), 1200, 1100),
])
def test_copies_larger_than_the_last_level_cache(layout, num_blocks, used):
    cache = random_cache(layout, num_blocks)
    table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(3))[:used].tolist()
    n = used * layout.block_size - 17
    data = gather_pages(cache, layout, table, n)
    assert data.numel() > 64 << 20
    assert torch.equal(data, reference_gather(cache, table, n))
    dst = torch.zeros_like(cache)
    scatter_pages(dst, layout, table, n, data)
    assert torch.equal(dst.view(torch.uint8), reference_scatter(torch.zeros_like(cache), table, n, data).view(torch.uint8))


def test_concurrent_callers_get_their_own_pages():
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, block_size=8, dtype="float32")
    cache = random_cache(layout, 128)
    tables = [list(range(i, 128, 4)) for i in range(4)]
    expected = [reference_gather(cache, t, len(t) * 8 - 3) for t in tables]
    failures = []

    def work(i: int) -> None:
        out = torch.empty_like(expected[i])
        for _ in range(20):
            gather_pages(cache, layout, tables[i], len(tables[i]) * 8 - 3, out=out)
            if not torch.equal(out, expected[i]):
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def _gather_in_child(cache, layout, table, n, expected: bytes, queue) -> None:
    # Only the native copier runs here: torch's OpenMP kernels are not fork-safe.
    out = torch.empty(len(expected), dtype=torch.uint8)
    gather_pages(cache, layout, table, n, out=out)
    queue.put(out.numpy().tobytes() == expected)


def test_thread_pool_works_in_a_forked_child():
    layout = KVLayout(num_layers=2, num_kv_heads=4, head_dim=64, block_size=16, dtype="float32")
    cache = random_cache(layout, 64)
    table, n = list(range(63, -1, -1)), 1000
    expected = reference_gather(cache, table, n).numpy().tobytes()
    assert gather_pages(cache, layout, table, n).numpy().tobytes() == expected  # pool is running
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_gather_in_child, args=(cache, layout, table, n, expected, queue))
    child.start()
    try:
        assert queue.get(timeout=120) is True
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
