"""Manifests lay tensors out aligned, survive a round trip, and reject malformed bytes."""

import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost import _C
from rlboost.errors import ProtocolError
from rlboost.transfer.manifest import DTYPE_SIZES, Manifest

shapes = st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple)
layouts = st.lists(st.tuples(st.sampled_from(sorted(DTYPE_SIZES)), shapes), max_size=12)


@settings(max_examples=60, deadline=None)
@given(layouts, st.sampled_from([256, 4096]), st.integers(0, 2**40))
def test_layout_is_aligned_disjoint_and_round_trips(layout, alignment, version):
    m = Manifest.from_layout(version, [(f"t{i}", d, s) for i, (d, s) in enumerate(layout)], alignment)
    end = 0
    for spec in m.tensors:
        assert spec.offset % alignment == 0 and spec.offset >= end
        end = spec.offset + spec.nbytes
    assert m.total_bytes == end
    assert Manifest.from_bytes(m.to_bytes(), version) == m


def test_build_from_tensors_matches_dtypes_and_shapes():
    t = {"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.zeros(2, dtype=torch.int64)}
    m = Manifest.build(4, t, alignment=256)
    assert [(s.name, s.dtype, s.shape, s.offset, s.nbytes) for s in m.tensors] == [
        ("a", "bfloat16", (3, 5), 0, 30), ("b", "int64", (2,), 256, 16)]


def _doc(**changes):
    doc = {"format_version": 1, "alignment": 256, "total_bytes": 512,
           "tensors": [["a", "float32", [4], 0, 16], ["b", "int8", [3], 256, 3]]}
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("data", [
    b"\xff\xfe not json",
    _doc(format_version=2),
    _doc(tensors=[["a", "float32", [4], 0, 17]]),                # nbytes does not match shape
    _doc(tensors=[["a", "float32", [4], 8, 16]]),                # misaligned
    _doc(tensors=[["a", "float32", [4], 0, 16], ["b", "int8", [3], 0, 3]]),  # overlapping
    _doc(tensors=[["a", "float32", [400], 0, 1600]]),            # past the payload
    _doc(tensors=[["a", "complex32", [4], 0, 16]]),              # unknown dtype
    _doc(tensors=[["a", "float32", [4.5], 0, 16]]),              # non-integer shape
    _doc(tensors=[["a", "float32", [4], 0]]),                    # missing field
    _doc(alignment=3),
])
def test_malformed_tensor_tables_raise_protocol_error(data):
    with pytest.raises(ProtocolError):
        Manifest.from_bytes(data, 1)


def _native(version, total, chunk, n=None, meta=b""):
    n = -(-total // chunk) if n is None else n
    tags = b"".join(bytes([i % 256]) * 16 for i in range(n))
    return _C.Manifest(version=version, total_bytes=total, chunk_bytes=chunk, tags=tags, meta=meta)


def test_native_manifest_round_trip_and_corruption():
    m = _native(3, 10000, 4096, meta=b"meta")
    back = _C.Manifest.decode(m.encode())
    assert (back.version, back.total_bytes, back.chunk_bytes, back.tags, back.meta) == \
        (3, 10000, 4096, bytes(16) + bytes([1]) * 16 + bytes([2]) * 16, b"meta")
    raw = bytearray(m.encode())
    raw[9] ^= 1
    with pytest.raises(ProtocolError):
        _C.Manifest.decode(bytes(raw))
    with pytest.raises(ProtocolError):
        _C.Manifest.decode(m.encode()[:-7])


def test_native_manifest_handles_payloads_over_4_gib_without_allocating_them():
    total = (5 << 30) + 123
    m = _native(1, total, 1 << 20)
    back = _C.Manifest.decode(m.encode())
    assert back.total_bytes == total and back.num_chunks == -(-total // (1 << 20))


def test_native_manifest_rejects_inconsistent_chunking():
    with pytest.raises(ValueError):
        _native(1, 10000, 4096, n=2)  # needs 3 chunks
    with pytest.raises(ValueError):
        _native(1, 10000, 100, n=100)  # chunk below the minimum
    with pytest.raises(ValueError):
        _C.Manifest(version=1, total_bytes=10000, chunk_bytes=4096, tags=bytes(47), meta=b"")


def _raw_native_manifest(version, total, chunk, tags, meta=b""):
    body = struct.pack("<qQII", version, total, chunk, len(tags) // 16) + tags
    body += struct.pack("<I", len(meta)) + meta
    return body + struct.pack("<I", _C.crc32c(body, 0))


@pytest.mark.parametrize("total", [2**64 - 1, 2**64 - 4096, 2**64 - 4095])
def test_native_manifest_chunk_count_does_not_wrap_near_2_64(total):
    # A checksummed manifest claiming an enormous payload with no chunks must not decode:
    # a wrapped chunk count would let a puller size a buffer from total_bytes.
    with pytest.raises(ProtocolError):
        _C.Manifest.decode(_raw_native_manifest(1, total, 4096, b""))
    with pytest.raises(ValueError):
        _native(1, total, 4096, n=0)


def test_raw_native_manifest_helper_matches_the_encoder():
    m = _native(2, 10000, 4096, meta=b"xy")
    assert _raw_native_manifest(2, 10000, 4096, m.tags, b"xy") == m.encode()
