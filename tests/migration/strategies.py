"""Hypothesis strategies for migration records, shared by the migration tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rlboost.migration.state import RequestState, SamplingParams

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
# Logprobs are float32 values by contract; NaN would make equality meaningless.
F32 = st.floats(width=32, allow_nan=False)

params = st.builds(
    SamplingParams,
    temperature=st.floats(min_value=0.0, allow_nan=False),
    top_p=st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
    top_k=U32,
    max_new_tokens=st.integers(1, 2**32 - 1),
    stop_token_ids=st.lists(U32, max_size=6).map(tuple),
)


@st.composite
def request_states(draw, sample_id=U64, max_prompt: int = 40, max_output: int = 40):
    n_out = draw(st.integers(0, max_output))
    return RequestState(
        sample_id=draw(sample_id),
        prompt_ids=tuple(draw(st.lists(U32, min_size=1, max_size=max_prompt))),
        params=draw(params),
        seed=draw(U64),
        weight_version=draw(I64),
        output_ids=tuple(draw(st.lists(U32, min_size=n_out, max_size=n_out))),
        output_logprobs=tuple(draw(st.lists(F32, min_size=n_out, max_size=n_out))),
        finish_reason=draw(st.sampled_from([None, "stop", "length"])),
    )


def long_state(sample_id: int, prompt_len: int, output_len: int, seed: int = 0) -> RequestState:
    """A state with long token lists, filled from a seeded generator (fast to build)."""
    rng = np.random.default_rng(seed)
    return RequestState(
        sample_id=sample_id,
        prompt_ids=tuple(rng.integers(0, 2**32, prompt_len, dtype=np.uint64).tolist()),
        params=SamplingParams(temperature=0.7, top_p=0.95, top_k=50, max_new_tokens=output_len + 1,
                              stop_token_ids=(0, 151643)),
        seed=seed,
        weight_version=12,
        output_ids=tuple(rng.integers(0, 152_000, output_len).tolist()),
        output_logprobs=tuple(rng.standard_normal(output_len).astype(np.float32).tolist()),
    )
