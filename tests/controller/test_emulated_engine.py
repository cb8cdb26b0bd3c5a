"""EmulatedEngine: deterministic tokens wherever a sample runs, and the time a configured GPU takes."""

import pytest

from rlboost.controller.clock import ManualClock, MonotonicClock
from rlboost.errors import RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.state import RequestState, SamplingParams
from rlboost.rollout.emulated.engine import EmulatedEngine, EmulatedEngineConfig
from rlboost.rollout.engine import RolloutEngine


def state(sid, max_new=64, prompt=(1, 2, 3), version=0, stop=(2,), seed=7):
    return RequestState(sample_id=sid, prompt_ids=prompt, params=SamplingParams(max_new_tokens=max_new, stop_token_ids=stop),
                        seed=seed, weight_version=version)


def engine(clock, version=0, **kw):
    cfg = dict(vocab_size=500, stop_probability=0.05, prefill_tokens_per_s=1e9, sample_tokens_per_s=10.0,
               decode_tokens_per_s=1000.0)
    e = EmulatedEngine(EmulatedEngineConfig(**{**cfg, **kw}), clock=clock)
    e.load_weights({}, version)
    return e


def drain(e, clock, seconds=1e6):
    clock.advance(seconds)
    out, first = {}, {}
    for d in e.poll(0.0):
        ids, lps, _ = out.get(d.sample_id, ((), (), None))
        assert d.start == first.setdefault(d.sample_id, d.start) + len(ids)  # contiguous deltas
        out[d.sample_id] = (ids + d.ids, lps + d.logprobs, d.finish_reason)
    return out


def test_it_is_a_rollout_engine():
    assert isinstance(EmulatedEngine(clock=ManualClock()), RolloutEngine)


def test_tokens_do_not_depend_on_interruptions_or_on_which_engine_continues():
    clock = ManualClock()
    a = engine(clock)
    a.submit([state(i) for i in range(6)])
    whole = drain(a, clock)
    b, c = engine(clock), engine(clock, sample_tokens_per_s=3.0)
    b.submit([state(i) for i in range(6)])
    clock.advance(1.25)
    seen = {}
    for d in b.poll(0.0):
        ids, lps, _ = seen.get(d.sample_id, ((), (), None))
        seen[d.sample_id] = (ids + d.ids, lps + d.logprobs, d.finish_reason)
    clock.advance(0.5)  # tokens generated but never polled travel in the exported state
    batch = b.export_states(list(range(6)) + [99])
    exported = {s.sample_id: s for s in batch.states}
    assert exported and set(exported) | {i for i, v in seen.items() if v[2]} == set(range(6))
    c.import_states(MigrationBatch(states=tuple(s for s in batch.states if not s.finished)))
    resumed = drain(c, clock)
    for sid in range(6):
        if sid in exported:
            s = exported[sid]
            assert s.output_ids[:len(seen.get(sid, ((),))[0])] == seen.get(sid, ((),))[0]
            ids, lps, fin = resumed.get(sid, ((), (), s.finish_reason))
            assert (s.output_ids + ids, s.output_logprobs + lps, fin) == whole[sid]
        else:
            assert seen[sid] == whole[sid]
    assert len({len(v[0]) for v in whole.values()}) > 1  # stop tokens make lengths vary
    assert all((v[2] == "stop") == (v[0][-1] == 2) for v in whole.values())  # eos id 2 ends "stop"


def test_eos_stops_a_sample_only_when_it_is_a_stop_token():
    clock = ManualClock()
    e = engine(clock, stop_probability=0.3)
    e.submit([state(1, stop=(2,)), state(2, stop=()), state(3, max_new=1)])
    out = drain(e, clock)
    assert out[1][2] == "stop" and out[1][0][-1] == 2 and 2 not in out[1][0][:-1]
    assert out[2][2] == "length" and len(out[2][0]) == 64 and 2 in out[2][0]  # eos flows on
    assert len(out[3][0]) == 1


def test_greedy_tokens_depend_on_prompt_and_weights_not_on_seed_or_id():
    clock = ManualClock()
    e = engine(clock)
    greedy = lambda sid, seed, prompt=(1, 2, 3): RequestState(  # noqa: E731
        sample_id=sid, prompt_ids=prompt, params=SamplingParams(temperature=0.0, max_new_tokens=16),
        seed=seed, weight_version=0)
    e.submit([greedy(1, 5), greedy(2, 6), greedy(3, 5, prompt=(4, 5))])
    out = drain(e, clock)
    assert out[1][0] == out[2][0] != out[3][0]


def test_decode_rate_is_shared_beyond_the_aggregate_limit_and_capacity_queues():
    clock = ManualClock()
    e = engine(clock, stop_probability=0.0, sample_tokens_per_s=10.0, decode_tokens_per_s=20.0, max_running=4)
    e.submit([state(i, max_new=1000) for i in range(6)])
    load = e.load()
    assert (load.running, load.queued, load.queued_tokens) == (4, 2, 6000)
    clock.advance(2.0)
    got = {}
    for d in e.poll(0.0):
        got[d.sample_id] = got.get(d.sample_id, 0) + len(d.ids)
    assert got == {0: 10, 1: 10, 2: 10, 3: 10}  # 20 tok/s over 4 samples = 5 tok/s each
    assert e.load().decode_tokens_per_s == pytest.approx(20.0, rel=0.2)


def test_by_default_a_full_engine_decodes_at_the_configured_engine_rate():
    """decode_tokens_per_s is what a full engine does (the README's 8000 tok/s example):
    each sample gets decode_tokens_per_s / max_running unless sample_tokens_per_s says
    otherwise, so a half-full engine decodes at half the rate."""
    for running, expected in ((64, 8000.0), (32, 4000.0)):
        clock = ManualClock()
        e = engine(clock, stop_probability=0.0, sample_tokens_per_s=None, decode_tokens_per_s=8000.0,
                   max_running=64)
        e.submit([state(i, max_new=10_000, stop=()) for i in range(running)])
        clock.advance(1.0)
        assert sum(len(d.ids) for d in e.poll(0.0)) == pytest.approx(expected, rel=0.01)
    assert EmulatedEngineConfig(decode_tokens_per_s=8000.0, max_running=64).per_sample_tokens_per_s == 125.0
    with pytest.raises(ValueError, match="sample_tokens_per_s"):
        EmulatedEngineConfig(sample_tokens_per_s=0.0)


def test_prefill_takes_time_and_imported_kv_pages_spare_it():
    clock = ManualClock()
    e = engine(clock, prefill_tokens_per_s=100.0, stop_probability=0.0)
    e.submit([state(1, prompt=tuple(range(1, 101)))])
    clock.advance(0.99)
    assert e.poll(0.0) == []
    clock.advance(0.2)
    assert e.poll(0.0)
    batch = e.export_states([1], with_kv=True)
    assert batch.kv_tokens == (batch.states[0].position - 1,)
    e.import_states(batch)  # the pages stand for all but one position: almost no prefill left
    clock.advance(0.2)
    assert any(d.sample_id == 1 for d in e.poll(0.0))


def test_abort_and_errors():
    clock = ManualClock()
    e = engine(clock)
    e.submit([state(1), state(2)])
    e.abort([1, 77])
    assert set(drain(e, clock).keys()) == {2}
    with pytest.raises(RolloutError, match="weight version"):
        e.submit([state(4, version=9)])
    e.submit([state(5, max_new=1000)])
    with pytest.raises(RolloutError, match="already admitted"):
        e.submit([state(5)])
    with pytest.raises(RolloutError, match="nothing left"):
        e.submit([state(6).extended((1,), (-0.1,), "stop")])
    with pytest.raises(ValueError, match="stop_probability"):
        EmulatedEngineConfig(stop_probability=2.0)
    e.close()
    with pytest.raises(RolloutError, match="closed"):
        e.poll(0.0)


def test_poll_on_a_real_clock_waits_for_tokens():
    clock = MonotonicClock(speed=50.0)  # 1 s of engine time per 20 ms
    e = engine(clock, stop_probability=0.0, sample_tokens_per_s=5.0)
    e.submit([state(1, max_new=10)])
    deltas = e.poll(5.0)
    assert deltas and deltas[0].sample_id == 1


def test_load_counts_only_samples_still_queued():
    clock = ManualClock()
    e = engine(clock, max_running=1, stop_probability=0.0)
    e.submit([state(i, max_new=1000) for i in range(4)])
    assert (e.load().running, e.load().queued) == (1, 3)
    e.abort([1, 2])
    e.export_states([3])
    assert (e.load().running, e.load().queued) == (1, 0)


def test_abort_drops_the_last_delta_of_a_sample_that_finished_unpolled():
    clock = ManualClock()
    e = engine(clock, stop_probability=0.0)
    e.submit([state(1, max_new=3), state(2, max_new=1000)])
    clock.advance(10.0)  # sample 1 finished long ago; nobody polled it
    e.abort([1])
    assert {d.sample_id for d in e.poll(0.0)} == {2}


def test_samples_longer_than_max_model_len_are_refused_whole():
    clock = ManualClock()
    e = engine(clock, max_model_len=40)
    with pytest.raises(RolloutError, match="max_model_len"):
        e.submit([state(1, max_new=30), state(2, max_new=38)])  # 3 + 38 > 40
    assert e.load().running + e.load().queued == 0
    e.submit([state(1, max_new=37)])
