"""The delta codec (csrc/weights/delta_codec.h): applying delta(a -> b) to a gives b's
bytes exactly, for any payload (sizes, odd tails, dense or sparse changes, in place or
not, any thread count); a malformed delta is a ProtocolError and never writes outside
its destination."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost import _C
from rlboost.errors import ProtocolError

BLOCK = _C.DELTA["min_block_bytes"]


def _encode(a: np.ndarray, b: np.ndarray, threads: int = 1, block: int = BLOCK) -> tuple[np.ndarray, dict]:
    delta, counts = _C.delta_encode(base=a.ctypes.data, target=b.ctypes.data, nbytes=a.size, base_version=1,
                                    target_version=2, block_bytes=block, threads=threads)
    return np.frombuffer(delta, dtype=np.uint8).copy(), counts


def _apply(delta: np.ndarray, base: np.ndarray, dst: np.ndarray, threads: int = 1) -> dict:
    return _C.delta_apply(delta=delta.ctypes.data, delta_bytes=delta.size, base=base.ctypes.data,
                          dst=dst.ctypes.data, nbytes=base.size, threads=threads)


def _changed(a: np.ndarray, positions: list[int], values: list[int]) -> np.ndarray:
    b = a.copy()
    for p, v in zip(positions, values):
        b[p % max(1, b.size)] ^= v
    return b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 3 * BLOCK + 7), seed=st.integers(0, 2**32 - 1),
       positions=st.lists(st.integers(0, 1 << 20), max_size=400), values=st.lists(st.integers(1, 255), max_size=400),
       dense=st.booleans(), threads=st.integers(1, 4), in_place=st.booleans())
def test_applying_a_delta_gives_the_target_exactly(n, seed, positions, values, dense, threads, in_place):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, n, dtype=np.uint8)
    b = rng.integers(0, 256, n, dtype=np.uint8) if dense else (_changed(a, positions, values) if n else a.copy())
    delta, counts = _encode(a, b, threads)
    dst = a.copy() if in_place else np.zeros(n, dtype=np.uint8)
    header = _apply(delta, dst if in_place else a, dst, threads)
    assert np.array_equal(dst, b)
    assert (header["base"], header["target"], header["total_bytes"]) == (1, 2, n)
    assert counts["same_blocks"] + counts["sparse_blocks"] + counts["raw_blocks"] == header["num_blocks"]


def test_a_sparse_bf16_update_is_small_and_exact():
    rng = np.random.default_rng(0)
    master = rng.standard_normal(1 << 20).astype(np.float32) * 0.02
    a = _bf16(master)
    master += 1e-4 * np.sign(rng.standard_normal(master.size)).astype(np.float32)
    b = _bf16(master)
    delta, counts = _encode(a, b, threads=2, block=_C.DELTA["block_bytes"])
    changed = np.count_nonzero(a.view(np.uint16) != b.view(np.uint16))
    assert counts["changed_words"] == changed and counts["raw_blocks"] == 0
    assert delta.size < 4 * changed  # a few bytes per changed value, nothing per unchanged one
    out = a.copy()
    _apply(delta, out, out)
    assert np.array_equal(out, b)


def test_a_delta_for_another_size_is_refused():
    a = np.zeros(BLOCK * 2, dtype=np.uint8)
    delta, _ = _encode(a, a)
    with pytest.raises(ValueError, match="payload of"):
        _C.delta_apply(delta=delta.ctypes.data, delta_bytes=delta.size, base=a.ctypes.data, dst=a.ctypes.data,
                       nbytes=a.size - 1)


@pytest.mark.parametrize("cut", [0, 10, 39, 41])
def test_a_truncated_delta_is_a_protocol_error(cut):
    a = np.arange(3 * BLOCK, dtype=np.uint32).astype(np.uint8)
    b = _changed(a, list(range(0, a.size, 97)), [3] * 200)
    delta, _ = _encode(a, b)
    short = delta[:cut].copy() if cut else delta[:-1].copy()
    with pytest.raises(ProtocolError):
        _C.delta_header(delta=short.ctypes.data, delta_bytes=short.size)


@settings(max_examples=300, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(1, 255)), min_size=1, max_size=6))
def test_a_damaged_delta_fails_cleanly_and_never_writes_outside_its_destination(flips):
    rng = np.random.default_rng(1)
    n = 2 * BLOCK + 5
    a = rng.integers(0, 256, n, dtype=np.uint8)
    b = _changed(a, list(rng.integers(0, n, 300)), list(rng.integers(1, 256, 300)))
    delta, _ = _encode(a, b)
    for pos, v in flips:
        delta[pos % delta.size] ^= v
    guarded = np.full(n + 2 * 64, 0xA5, dtype=np.uint8)  # guard bands either side of dst
    dst = guarded[64:64 + n]
    try:
        _apply(delta, a, dst)
    except (ProtocolError, ValueError):
        pass
    assert np.all(guarded[:64] == 0xA5) and np.all(guarded[64 + n:] == 0xA5)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as bytes."""
    bits = x.view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).view(np.uint8)
