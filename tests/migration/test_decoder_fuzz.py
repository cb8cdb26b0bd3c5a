"""Fuzzing the decoders: any input yields valid records or ProtocolError, never a crash.

Random bytes, mutations of valid buffers (flips, inserts, deletes, splices, truncation),
and mutations whose checksums were recomputed so the structural and semantic checks
behind the checksum get exercised too.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost.errors import ProtocolError
from rlboost.migration.batch import MigrationBatch, pack_batch, unpack_batch
from rlboost.migration.layout import KVLayout
from rlboost.migration.state import RequestState, pack_states, unpack_states

from .hostile import BATCH_HEADER, reseal_batch_header, reseal_states
from .strategies import long_state, request_states

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode_states_or_protocol_error(buf: bytes) -> None:
    try:
        states = unpack_states(buf)
    except ProtocolError:
        return
    assert all(isinstance(s, RequestState) for s in states)
    assert len(unpack_states(pack_states(states))) == len(states)  # what decodes can travel again


def decode_batch_or_protocol_error(buf: bytes) -> None:
    try:
        batch = unpack_batch(buf)
    except ProtocolError:
        return
    assert isinstance(batch, MigrationBatch)


@st.composite
def mutated(draw, base: bytes) -> bytes:
    buf = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[pos] ^= draw(st.integers(1, 255))
        elif op == "set" and len(buf) >= pos + 8:
            buf[pos:pos + 8] = draw(st.sampled_from([b"\xff" * 8, b"\0" * 8, b"\x00\x00\x00\x80" * 2]))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del buf[pos:pos + draw(st.integers(1, 16))]
        elif op == "truncate":
            del buf[pos:]
        elif op == "splice":
            buf[pos:pos] = base[: draw(st.integers(0, len(base)))]
    return bytes(buf)


STATES = pack_states([long_state(1, 4, 6, seed=1), long_state(2, 1, 0, seed=2), long_state(3, 3, 2, seed=3)])
_LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, block_size=2, dtype="float16")
BATCH = pack_batch(MigrationBatch(
    states=(long_state(1, 2, 2), long_state(2, 3, 1)), kv_layout=_LAYOUT, kv_tokens=(3, 1),
    kv_data=(torch.arange(3 * _LAYOUT.token_bytes, dtype=torch.uint8), torch.ones(_LAYOUT.token_bytes, dtype=torch.uint8))))


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(buf):
    decode_states_or_protocol_error(buf)
    decode_batch_or_protocol_error(buf)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_behind_valid_magic(tail):
    decode_states_or_protocol_error(b"RLBS\x01\x00\x01\x00" + tail)
    decode_batch_or_protocol_error(b"RLBB\x01\x00\x01\x00" + tail)


@FUZZ
@given(mutated(STATES))
def test_mutated_state_buffers(buf):
    decode_states_or_protocol_error(buf)


@FUZZ
@given(mutated(STATES))
def test_mutated_state_buffers_with_recomputed_checksum(buf):
    if len(buf) >= 4:
        decode_states_or_protocol_error(reseal_states(buf))


@FUZZ
@given(mutated(BATCH))
def test_mutated_batch_buffers(buf):
    decode_batch_or_protocol_error(buf)


@FUZZ
@given(st.integers(0, BATCH_HEADER - 5), st.binary(min_size=1, max_size=4))
def test_batch_headers_with_recomputed_checksum(pos, patch):
    buf = bytearray(BATCH)
    buf[pos:pos + len(patch)] = patch
    states_len = int.from_bytes(buf[24:32], "little")
    table = (BATCH_HEADER + states_len + 63) // 64 * 64
    count = max(0, min(int.from_bytes(buf[8:12], "little"), (len(buf) - table) // 16))
    decode_batch_or_protocol_error(reseal_batch_header(bytes(buf), table, count))


@settings(max_examples=100, deadline=None)
@given(st.lists(request_states(max_prompt=6, max_output=6), min_size=1, max_size=4), st.data())
def test_mutations_of_arbitrary_valid_buffers(states, data):
    buf = pack_states(states)
    decode_states_or_protocol_error(data.draw(mutated(buf)))
