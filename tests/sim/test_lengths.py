"""Emulated response lengths: a long tail that depends only on the sample, not on the engine
that runs it, so a migrated sample ends where it would have and the simulator draws the same."""

from __future__ import annotations

import statistics

import pytest

from rlboost.migration.state import RequestState, SamplingParams
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.rollout.emulated.engine import EmulatedEngine
from rlboost.rollout.emulated.lengths import LengthConfig, prompt_key, response_length


def test_the_tail_is_long_and_capped():
    cfg = LengthConfig(kind="lognormal")
    lengths = [response_length(cfg, g * 104_729 + 1, s, 14_336) for g in range(600) for s in range(8)]
    assert all(1 <= n <= 14_336 for n in lengths)
    assert statistics.mean(lengths) == pytest.approx(cfg.mean_tokens(14_336), rel=0.08)
    ordered = sorted(lengths)
    assert ordered[int(0.99 * len(ordered))] > 3 * statistics.median(lengths)
    assert 0.01 < sum(n == 14_336 for n in lengths) / len(lengths) < 0.1


def test_a_sample_ends_at_the_same_length_on_any_engine_and_after_a_move():
    cfg = EmulatedEngineConfig(lengths=LengthConfig(kind="lognormal", median_tokens=40.0), vocab_size=50,
                               sample_tokens_per_s=1000.0)

    class Clock:
        virtual, t = True, 0.0

        def now(self):
            return self.t

    state = RequestState(sample_id=7, prompt_ids=(3, 4), params=SamplingParams(max_new_tokens=300, stop_token_ids=(2,)),
                         seed=5, weight_version=0)
    want = response_length(cfg.lengths, prompt_key(state.prompt_ids, state.seed), 7, 300)
    clock = Clock()
    a = EmulatedEngine(cfg, clock=clock)
    a.load_weights({}, 0)
    a.submit([state])
    clock.t = 0.01
    half = a.export_states([7]).states[0]
    b = EmulatedEngine(cfg, clock=clock)
    b.load_weights({}, 0)
    b.submit([half])
    clock.t = 10.0
    deltas = b.poll(0.0)
    assert len(half.output_ids) + sum(len(d.ids) for d in deltas) == want
    assert deltas[-1].finish_reason == ("stop" if want < 300 else "length")
    assert deltas[-1].ids[-1] == 2 or want == 300


def test_bad_length_settings_are_refused():
    with pytest.raises(ValueError, match="kind"):
        LengthConfig(kind="pareto")
    with pytest.raises(ValueError, match="median_tokens"):
        LengthConfig(median_tokens=0.5)
