"""Checksums and authentication primitives match their specifications."""

import hashlib
import hmac
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost import _C


def crc32c_reference(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_crc32c_known_vectors():
    assert _C.crc32c(b"123456789") == 0xE3069283
    assert _C.crc32c(b"") == 0
    assert _C.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=3000))
def test_crc32c_matches_bitwise_reference(data):
    assert _C.crc32c(data) == crc32c_reference(data) == _C.crc32c_portable(data)


@settings(max_examples=25, deadline=None)
@given(st.integers(12 * 1024, 40 * 1024), st.integers(0, 2**32), st.integers(0, 40 * 1024))
def test_crc32c_fast_paths_match_and_extend(size, seed, cut):
    # These sizes take the folding path (>= 1 KiB) and the three-lane path (tails).
    data = random.Random(seed).randbytes(size)
    cut = min(cut, len(data))
    assert _C.crc32c(data) == _C.crc32c_portable(data)
    assert _C.crc32c(data[cut:], _C.crc32c(data[:cut])) == _C.crc32c(data)
    # Unaligned starts (memoryview slices do not copy).
    assert _C.crc32c(memoryview(data)[cut % 61:]) == _C.crc32c_portable(data[cut % 61:])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 20 * 1024), st.integers(0, 2**32 - 1), st.integers(0, 127), st.booleans())
def test_crc32c_copy_copies_and_checksums_in_one_pass(size, seed, dst_offset, streaming):
    # Offsets exercise the unaligned head that streaming stores need peeled off.
    data = random.Random(seed).randbytes(size)
    dst = bytearray(size + 256)
    crc = _C.crc32c_copy(memoryview(dst)[dst_offset:], data, seed, streaming)
    assert crc == _C.crc32c(data, seed)
    assert dst[dst_offset:dst_offset + size] == data
    assert not any(dst[:dst_offset]) and not any(dst[dst_offset + size:])


def test_crc32c_copy_refuses_a_short_or_read_only_destination():
    with pytest.raises(ValueError, match="smaller"):
        _C.crc32c_copy(bytearray(3), b"four")
    with pytest.raises(BufferError):
        _C.crc32c_copy(b"read-only", b"data")


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=500))
def test_hmac_sha256_matches_python(key, msg):
    assert _C.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def test_hmac_rfc4231_case_2():
    want = bytes.fromhex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    assert _C.hmac_sha256(b"Jefe", b"what do ya want for nothing?") == want


def test_non_contiguous_buffers_are_refused():
    import numpy as np

    with pytest.raises((BufferError, ValueError)):
        _C.crc32c(np.zeros((4, 4), dtype=np.uint8)[:, 0])


def test_transports_report_capabilities():
    names = {t["name"]: t for t in _C.transports()}
    assert names["tcp"]["same_host_only"] is False
    assert names["shm"]["same_host_only"] is True and names["shm"]["needs_shared_region"] is True
    assert ("ucx" in names) == _C.HAS_UCX
