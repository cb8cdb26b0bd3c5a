"""MigrationBatch: validation, pack/unpack round trips with and without KV, bad buffers."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost import _C
from rlboost.errors import ProtocolError
from rlboost.migration.batch import MigrationBatch, pack_batch, packed_batch_nbytes, unpack_batch
from rlboost.migration.kv import KVLayout, gather_pages, scatter_pages
from rlboost.migration.state import RequestState, SamplingParams, pack_states

from .hostile import BATCH_HEADER, put, reseal_batch_header
from .strategies import long_state, request_states

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype="bfloat16")


def kv_batch(states, layout=LAYOUT, seed=0) -> MigrationBatch:
    g = torch.Generator().manual_seed(seed)
    tokens = tuple(max(s.position - 1, 0) for s in states)
    data = tuple(torch.randint(0, 256, (n * layout.token_bytes,), dtype=torch.uint8, generator=g) for n in tokens)
    return MigrationBatch(states=tuple(states), kv_layout=layout, kv_tokens=tokens, kv_data=data)


def assert_same(a: MigrationBatch, b: MigrationBatch) -> None:
    assert a.states == b.states
    assert a.kv_layout == b.kv_layout
    assert a.kv_tokens == b.kv_tokens
    if a.kv_data is None:
        assert b.kv_data is None
    else:
        assert len(a.kv_data) == len(b.kv_data)
        assert all(torch.equal(x, y) for x, y in zip(a.kv_data, b.kv_data))


layouts = st.builds(KVLayout, num_layers=st.integers(1, 3), num_kv_heads=st.integers(1, 3),
                    head_dim=st.integers(1, 8), block_size=st.integers(1, 32),
                    dtype=st.sampled_from(["float32", "float16", "bfloat16"]))


@settings(max_examples=80, deadline=None)
@given(st.lists(request_states(max_prompt=8, max_output=8), max_size=5, unique_by=lambda s: s.sample_id),
       layouts, st.booleans(), st.integers(0, 2**32))
def test_roundtrip_any_batch(states, layout, with_kv, seed):
    b = kv_batch(states, layout, seed) if with_kv else MigrationBatch(states=tuple(states))
    assert_same(unpack_batch(pack_batch(b)), b)


@settings(max_examples=40, deadline=None)
@given(st.lists(request_states(max_prompt=8, max_output=8), max_size=4, unique_by=lambda s: s.sample_id),
       layouts, st.booleans())
def test_pack_into_a_reused_buffer(states, layout, with_kv):
    b = kv_batch(states, layout) if with_kv else MigrationBatch(states=tuple(states))
    expected = pack_batch(b)
    assert packed_batch_nbytes(b) == len(expected)
    out = bytearray(b"\xee" * (len(expected) + 10))  # stale contents must not leak into padding
    assert len(pack_batch(b, out=out)) == len(expected)
    assert out[:len(expected)] == expected
    tensor_out = torch.full((len(expected),), 7, dtype=torch.uint8)
    assert len(pack_batch(b, out=tensor_out)) == len(expected)
    assert tensor_out.numpy().tobytes() == expected


def test_pack_batch_with_out_returns_the_packed_view_of_it():
    b = kv_batch([long_state(1, 3, 3), long_state(2, 5, 1)])
    expected = pack_batch(b)
    # A staging view larger than the batch, as a publisher would hand out.
    staging = torch.full((len(expected) + 4096,), 0xEE, dtype=torch.uint8)
    view = pack_batch(b, out=staging)
    assert isinstance(view, torch.Tensor) and view.data_ptr() == staging.data_ptr()
    assert view.numpy().tobytes() == expected
    assert_same(unpack_batch(view.numpy()), b)
    buf = bytearray(len(expected) + 1)
    packed = pack_batch(b, out=buf)
    assert bytes(packed) == expected and len(buf) == len(expected) + 1
    with pytest.raises(ValueError, match=f"needs {len(expected)}"):
        pack_batch(b, out=bytearray(len(expected) - 1))


def test_pack_into_rejects_small_or_read_only_buffers():
    b = kv_batch([long_state(1, 3, 3)])
    need = packed_batch_nbytes(b)
    with pytest.raises(ValueError, match=f"needs {need}"):
        pack_batch(b, out=bytearray(need - 1))
    with pytest.raises(ValueError, match="writable"):
        pack_batch(b, out=bytes(need))
    with pytest.raises(ValueError, match="CPU torch.uint8"):
        pack_batch(b, out=torch.zeros(need, dtype=torch.int8))


def test_roundtrip_long_samples_with_kv():
    states = [long_state(i, 200, 3000 + i, seed=i) for i in range(4)]
    layout = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16, dtype="float16")
    b = kv_batch(states, layout)
    assert_same(unpack_batch(pack_batch(b)), b)


def test_kv_views_share_a_writable_buffer_and_copy_read_only_bytes():
    b = kv_batch([long_state(1, 10, 10)])
    buf = bytearray(pack_batch(b))
    from_writable = unpack_batch(buf)
    from_bytes = unpack_batch(bytes(buf))
    offset = bytes(buf).find(b.kv_data[0].numpy().tobytes())
    buf[offset] ^= 0xFF  # the view follows the receive buffer; the copy does not
    assert from_writable.kv_data[0][0].item() == buf[offset]
    assert torch.equal(from_bytes.kv_data[0], b.kv_data[0])


def test_empty_batch_and_zero_kv_tokens():
    assert unpack_batch(pack_batch(MigrationBatch(states=()))).states == ()
    s = RequestState(sample_id=1, prompt_ids=(5,), params=SamplingParams(), seed=0, weight_version=0)
    b = MigrationBatch(states=(s,), kv_layout=LAYOUT, kv_tokens=(0,), kv_data=(torch.empty(0, dtype=torch.uint8),))
    assert_same(unpack_batch(pack_batch(b)), b)


def test_kv_pages_travel_between_engines_with_different_block_sizes():
    src_layout = KVLayout(num_layers=3, num_kv_heads=2, head_dim=8, block_size=16, dtype="float32")
    dst_layout = KVLayout(num_layers=3, num_kv_heads=2, head_dim=8, block_size=5, dtype="float32")
    src = torch.randn(src_layout.cache_shape(10))
    src_table = [7, 2, 9]
    dst = torch.zeros(dst_layout.cache_shape(40))
    state = long_state(9, 20, 18)
    n = state.position - 1
    data = gather_pages(src, src_layout, src_table, n)
    b = MigrationBatch(states=(state,), kv_layout=src_layout, kv_tokens=(n,), kv_data=(data,))
    got = unpack_batch(pack_batch(b))
    table = list(range(39, 39 - 8, -1))  # 8 blocks of 5 tokens
    scatter_pages(dst, dst_layout, table, got.kv_tokens[0], got.kv_data[0])
    src_tokens = src.reshape(3, 2, 160, 2, 8)[:, :, [src_table[t // 16] * 16 + t % 16 for t in range(n)]]
    dst_flat = dst.reshape(3, 2, 200, 2, 8)
    dst_tokens = dst_flat[:, :, [table[t // 5] * 5 + t % 5 for t in range(n)]]
    assert torch.equal(src_tokens, dst_tokens)


@pytest.mark.parametrize("fields, match", [
    (dict(kv_layout=LAYOUT), "all set or all None"),
    (dict(kv_layout=LAYOUT, kv_tokens=(1,), kv_data=()), "one entry per state"),
    (dict(kv_layout=LAYOUT, kv_tokens=(99,), kv_data=(torch.empty(0, dtype=torch.uint8),)), "kv_tokens"),
    (dict(kv_layout=LAYOUT, kv_tokens=(1.0,), kv_data=(torch.empty(0, dtype=torch.uint8),)), "ints"),
    (dict(kv_layout=LAYOUT, kv_tokens=(1,), kv_data=(torch.empty(3, dtype=torch.uint8),)), "expected"),
    (dict(kv_layout=LAYOUT, kv_tokens=(1,), kv_data=(torch.empty(64),)), "uint8"),
    (dict(format_version=2), "format_version"),
])
def test_batch_validation(fields, match):
    s = RequestState(sample_id=1, prompt_ids=(5, 6), params=SamplingParams(), seed=0, weight_version=0)
    with pytest.raises(ValueError, match=match):
        MigrationBatch(states=(s,), **fields)


def test_batch_rejects_duplicate_samples():
    s = long_state(1, 2, 2)
    with pytest.raises(ValueError, match="distinct"):
        MigrationBatch(states=(s, s))


@pytest.fixture(scope="module")
def packed() -> bytes:
    return pack_batch(kv_batch([long_state(1, 3, 4, seed=1), long_state(2, 2, 9, seed=2)]))


def test_every_truncation_is_rejected(packed):
    for cut in range(len(packed)):
        with pytest.raises(ProtocolError):
            unpack_batch(packed[:cut])


def test_every_single_byte_corruption_is_rejected(packed):
    rng = random.Random(0)
    for pos in range(len(packed)):
        bad = bytearray(packed)
        bad[pos] ^= rng.randrange(1, 256)
        with pytest.raises(ProtocolError):
            unpack_batch(bytes(bad))


def _count(buf: bytes) -> int:
    """The header's sample count, as far as the table it implies fits in the buffer."""
    return min(int.from_bytes(buf[8:12], "little"), (len(buf) - _table_offset(buf)) // 16)


def _table_offset(buf: bytes) -> int:
    states_len = int.from_bytes(buf[24:32], "little")
    return (BATCH_HEADER + states_len + 63) // 64 * 64


@pytest.mark.parametrize("offset, fmt, value, match", [
    (4, "<H", 2, "wire version"),
    (6, "<H", 2, "flags"),
    (8, "<I", 3, "count"),
    (8, "<I", 2**31, "count|limits"),
    (12, "<H", 5, "batch record version"),
    (14, "<H", 5, "KV layout version"),
    (24, "<Q", 2**63, "exceed"),
    (32, "<I", 0, "layout"),
    (36, "<I", 2**21, "layout"),
    (48, "<B", 9, "layout"),
    (50, "<B", 1, "reserved"),
])
def test_hostile_header_fields_with_valid_checksum(packed, offset, fmt, value, match):
    forged = put(packed, offset, fmt, value)
    with pytest.raises(ProtocolError, match=match):
        unpack_batch(reseal_batch_header(forged, _table_offset(forged), _count(forged)))


@pytest.mark.parametrize("kv_tokens", [2**64 - 1, 2**40, 4, 3])
def test_hostile_kv_tokens_with_valid_checksum(packed, kv_tokens):
    table = _table_offset(packed)
    with pytest.raises(ProtocolError):
        unpack_batch(reseal_batch_header(put(packed, table, "<Q", kv_tokens), table, 2))


def test_kv_tokens_beyond_the_state_position_is_a_protocol_error():
    """A peer's encoder (not MigrationBatch) could claim K/V for tokens the state lacks."""
    s = RequestState(sample_id=1, prompt_ids=(5, 6), params=SamplingParams(), seed=0, weight_version=0)
    kv = torch.zeros(3 * LAYOUT.token_bytes, dtype=torch.uint8)
    layout = (LAYOUT.num_layers, LAYOUT.num_kv_heads, LAYOUT.head_dim, LAYOUT.block_size, 3)
    forged = _C.migration.encode_batch(pack_states([s]), 1, layout, 1, 1, [(3, kv.data_ptr(), kv.numel())])
    with pytest.raises(ProtocolError, match="kv_tokens"):
        unpack_batch(forged)


def test_duplicate_samples_in_a_buffer_are_a_protocol_error():
    s = long_state(4, 2, 2)
    forged = _C.migration.encode_batch(pack_states([s, s]), 2, None, 1, 1, [])
    with pytest.raises(ProtocolError, match="distinct"):
        unpack_batch(forged)
