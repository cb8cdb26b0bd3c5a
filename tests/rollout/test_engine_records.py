"""The records engines hand across processes are versioned and check themselves."""

import pytest

from rlboost.rollout.engine import ENGINE_RECORD_FORMAT_VERSION, EngineLoad, TokenDelta


def test_token_delta_is_versioned_and_pairs_each_token_with_a_logprob():
    d = TokenDelta(sample_id=1, start=0, ids=(4, 5), logprobs=(-0.1, -0.2), finish_reason=None, weight_version=0)
    assert d.format_version == ENGINE_RECORD_FORMAT_VERSION
    with pytest.raises(ValueError, match="format_version"):
        TokenDelta(sample_id=1, start=0, ids=(4,), logprobs=(-0.1,), finish_reason=None, weight_version=0,
                   format_version=ENGINE_RECORD_FORMAT_VERSION + 1)
    with pytest.raises(ValueError, match="logprobs"):
        TokenDelta(sample_id=1, start=0, ids=(4, 5), logprobs=(-0.1,), finish_reason=None, weight_version=0)


def test_engine_load_is_versioned():
    assert EngineLoad(running=1, queued=0, queued_tokens=9, decode_tokens_per_s=1.0,
                      weight_version=2).format_version == ENGINE_RECORD_FORMAT_VERSION
    with pytest.raises(ValueError, match="format_version"):
        EngineLoad(running=1, queued=0, queued_tokens=9, decode_tokens_per_s=1.0, weight_version=2,
                   format_version=99)
