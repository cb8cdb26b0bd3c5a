"""Migration is invisible in the tokens: samples that hop between two engines at random
positions (through the instances' sender and receiver, tokens only or with their KV pages) generate
exactly what they would have generated without moving."""

import random

import pytest
from engine_contract import Collected, absorb, collect
from handoff_helpers import migrate

from rlboost.migration.state import RequestState, SamplingParams
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig

N_SAMPLES, MAX_NEW, HOPS = 16, 64, 3
PARAMS = [SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW),
          SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW),
          SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=MAX_NEW),
          SamplingParams(temperature=1.2, top_k=20, max_new_tokens=MAX_NEW)]


def make_states() -> list[RequestState]:
    rng = random.Random(0)
    return [RequestState(sample_id=1000 + i, seed=99, weight_version=0, params=PARAMS[i % len(PARAMS)],
                         prompt_ids=tuple(rng.randrange(259) for _ in range(rng.randint(2, 40))))
            for i in range(N_SAMPLES)]


@pytest.fixture(scope="module")
def reference(tiny_ckpt):
    with EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), stream_interval=16)) as engine:
        states = make_states()
        engine.submit(states)
        return collect(engine, [s.sample_id for s in states])


@pytest.mark.parametrize("with_kv", [False, True], ids=["tokens-only", "with-kv"])
def test_migrated_samples_match_uninterrupted_run(tiny_ckpt, reference, with_kv):
    rng = random.Random(1234)
    # Two differently shaped engines: the second has smaller blocks, a small batch limit and
    # a cache small enough to evict, so pages cross block sizes and resumed samples queue.
    engines = [EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), stream_interval=1)),
               EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), stream_interval=1, block_size=8,
                                                   num_blocks=64, max_batch_size=6, max_prefill_tokens=24))]
    try:
        states = make_states()
        home = {s.sample_id: rng.randrange(2) for s in states}
        hops = {s.sample_id: sorted(rng.sample(range(1, MAX_NEW - 1), HOPS)) for s in states}
        for e in (0, 1):
            engines[e].submit([s for s in states if home[s.sample_id] == e])
        out: dict[int, Collected] = {s.sample_id: Collected() for s in states}
        moved = 0
        while any(c.finish is None for c in out.values()):
            for engine in engines:
                absorb(out, engine.poll(0.005))
            due = [sid for sid, at in hops.items() if at and out[sid].finish is None and len(out[sid].ids) >= at[0]]
            groups = [[sid for sid in due if home[sid] == src] for src in (0, 1)]
            for src, ids in enumerate(groups):
                if not ids:
                    continue
                rng.shuffle(ids)
                result = migrate(engines[src], engines[1 - src], ids, mode="kv" if with_kv else "tokens")
                for state in result.states:
                    assert list(state.output_ids[:len(out[state.sample_id].ids)]) == out[state.sample_id].ids
                    out[state.sample_id] = Collected(ids=list(state.output_ids),
                                                     logprobs=list(state.output_logprobs))
                    home[state.sample_id] = 1 - src
                    moved += 1
                for sid in ids:
                    hops[sid].pop(0)
        assert moved >= N_SAMPLES  # on average every sample hopped at least once
        for sid, ref in reference.items():
            assert out[sid].ids == ref.ids, f"sample {sid} diverged"
            assert out[sid].logprobs == pytest.approx(ref.logprobs, abs=1e-5)
            assert out[sid].finish == ref.finish
    finally:
        for engine in engines:
            engine.close()
