"""pack_states/unpack_states round-trip every valid state and reject what cannot travel."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost import _C
from rlboost.migration.state import RequestState, SamplingParams, pack_states, unpack_states

from .strategies import long_state, request_states


@settings(max_examples=200, deadline=None)
@given(st.lists(request_states(), max_size=8))
def test_roundtrip_any_valid_states(states):
    assert unpack_states(pack_states(states)) == states


def test_roundtrip_empty_list():
    buf = pack_states([])
    assert unpack_states(buf) == []


@pytest.mark.parametrize("finish", [None, "stop", "length"])
def test_roundtrip_extremes(finish):
    s = RequestState(
        sample_id=2**64 - 1, prompt_ids=(0, 2**32 - 1), seed=2**64 - 1, weight_version=-(2**63),
        params=SamplingParams(temperature=float("inf"), top_p=5e-324, top_k=2**32 - 1,
                              max_new_tokens=2**32 - 1, stop_token_ids=(0, 2**32 - 1)),
        output_ids=(2**32 - 1, 0), output_logprobs=(float("-inf"), -3.4028234663852886e38),
        finish_reason=finish)
    assert unpack_states(pack_states([s])) == [s]


def test_roundtrip_long_outputs_and_many_samples():
    states = [long_state(i, prompt_len=300, output_len=20_000 if i % 7 == 0 else i, seed=i) for i in range(64)]
    assert unpack_states(pack_states(states)) == states


def test_unpack_accepts_any_bytes_like():
    states = [long_state(1, 5, 9)]
    buf = pack_states(states)
    assert unpack_states(bytearray(buf)) == states
    assert unpack_states(memoryview(buf)) == states
    padded = b"xx" + buf
    assert unpack_states(memoryview(padded)[2:]) == states


@pytest.mark.parametrize("field, value", [
    ("prompt_ids", (1, -1)),
    ("prompt_ids", (2**32,)),
    ("output_ids", (2**40,)),
    ("prompt_ids", (1, "x")),
])
def test_pack_rejects_token_ids_outside_u32(field, value):
    base = dict(sample_id=5, prompt_ids=(1,), params=SamplingParams(), seed=0, weight_version=0)
    if field == "output_ids":
        base.update(output_ids=value, output_logprobs=(0.0,) * len(value))
    else:
        base[field] = value
    with pytest.raises(ValueError, match="sample 5"):
        pack_states([RequestState(**base)])


def test_pack_rejects_stop_ids_outside_u32():
    s = RequestState(sample_id=3, prompt_ids=(1,), params=SamplingParams(stop_token_ids=(2**33,)),
                     seed=0, weight_version=0)
    with pytest.raises(ValueError, match="sample 3"):
        pack_states([s])


@pytest.mark.parametrize("kwargs", [
    dict(seed=-1), dict(seed=2**64), dict(weight_version=2**63), dict(sample_id=-1),
])
def test_records_reject_values_the_codec_cannot_carry(kwargs):
    base = dict(sample_id=1, prompt_ids=(1,), params=SamplingParams(), seed=0, weight_version=0)
    with pytest.raises(ValueError):
        RequestState(**{**base, **kwargs})


@pytest.mark.parametrize("kwargs", [dict(top_k=2**32), dict(max_new_tokens=2**32), dict(top_k=-1)])
def test_sampling_params_reject_values_the_codec_cannot_carry(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_logprobs_are_stored_as_float32():
    s = RequestState(sample_id=1, prompt_ids=(1,), params=SamplingParams(), seed=0, weight_version=0,
                     output_ids=(4,), output_logprobs=(0.1,))
    (back,) = unpack_states(pack_states([s]))
    assert back.output_logprobs == (0.10000000149011612,)  # nearest float32 to 0.1


def test_crc32c_known_values_and_paths_agree():
    crc = _C.migration.crc32c
    assert crc(b"") == 0
    assert crc(b"123456789") == 0xE3069283
    assert crc(bytes(32)) == 0x8A9136AA
    data = os.urandom(5 << 20)  # several chunks: exercises the threaded chunk combination
    for n in (1, 7, 8, 9, 1000, (1 << 20) + 3, len(data)):
        assert crc(data[:n]) == _C.crc32c_portable(data[:n]) == _C.crc32c(data[:n])
