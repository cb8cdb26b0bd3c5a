"""Contract tests every RolloutEngine must pass (embedded, SGLang adapter, emulated).

Use: subclass `EngineContract` in a test module and provide a `contract_target` fixture
returning a `ContractTarget` for the engine under test (see test_embedded_contract.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import pytest

from rlboost.errors import EngineBusy, RolloutError
from rlboost.migration.batch import pack_batch, unpack_batch
from rlboost.migration.state import RequestState, SamplingParams
from rlboost.rollout.engine import RolloutEngine

DEADLINE_S = 60.0


@dataclass
class ContractTarget:
    """How to build and feed the engine under test."""

    make_engine: Callable[[], RolloutEngine]      # fresh engine; weights = `weights()`
    vocab_size: int
    weight_version: int                           # version the fresh engine has loaded
    weights: Callable[[], Mapping[str, object]]   # the same weights, HF-named
    other_weights: Callable[[], Mapping[str, object]]  # different weights of the same shapes
    supports_kv: bool = True                      # must agree with the engine's `exports_kv`


def exports_kv(engine) -> bool:
    """Whether the engine declares it can ship KV pages (see RolloutEngine)."""
    return getattr(engine, "exports_kv", True)


def batch_invariant(engine) -> bool:
    """Whether the engine declares its tokens independent of batch and of re-prefill."""
    return getattr(engine, "batch_invariant", True)


@dataclass
class Collected:
    """Everything one sample streamed, checked for gaps and duplicates on arrival."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    versions: set[int] = field(default_factory=set)


def make_state(sid: int, version: int, *, prompt_len: int = 6, max_new: int = 12, temperature: float = 1.0,
               seed: int = 17, stop: tuple[int, ...] = (), top_k: int = 0, top_p: float = 1.0,
               output: tuple[int, ...] = (), logprobs: tuple[float, ...] = (),
               prompt_of: int | None = None) -> RequestState:
    """A sample whose prompt is derived from prompt_of (default: its own id)."""
    key = sid if prompt_of is None else prompt_of
    prompt = tuple((key * 31 + 7 * i) % 250 + 1 for i in range(prompt_len))
    return RequestState(sample_id=sid, prompt_ids=prompt, seed=seed, weight_version=version,
                        params=SamplingParams(temperature=temperature, max_new_tokens=max_new,
                                              stop_token_ids=stop, top_k=top_k, top_p=top_p),
                        output_ids=output, output_logprobs=logprobs)


def absorb(out: dict[int, Collected], deltas) -> None:
    for d in deltas:
        c = out.setdefault(d.sample_id, Collected())
        assert c.finish is None, f"delta for sample {d.sample_id} after its finish"
        assert d.start == len(c.ids), f"sample {d.sample_id}: delta starts at {d.start}, have {len(c.ids)}"
        assert len(d.ids) == len(d.logprobs) and d.ids
        c.ids += d.ids
        c.logprobs += d.logprobs
        c.finish = d.finish_reason
        c.versions.add(d.weight_version)


def collect(engine: RolloutEngine, ids, out: dict[int, Collected] | None = None) -> dict[int, Collected]:
    """Poll until every sample in ids has finished."""
    out = {} if out is None else out
    deadline = time.monotonic() + DEADLINE_S
    while any(out.get(i, Collected()).finish is None for i in ids):
        assert time.monotonic() < deadline, "samples did not finish in time"
        absorb(out, engine.poll(1.0))
    return out


def poll_until(engine: RolloutEngine, out: dict[int, Collected], pred) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred(out):
        assert time.monotonic() < deadline, "condition not reached in time"
        absorb(out, engine.poll(1.0))


def run_alone(engine: RolloutEngine, states) -> dict[int, Collected]:
    engine.submit(states)
    return collect(engine, [s.sample_id for s in states])


def assert_same_or_whole(engine, got: Collected, want: Collected) -> None:
    """Tokens equal the reference on a batch-invariant engine; on any other engine the
    sample still runs, gap-free (see absorb), to the reference's full length."""
    if batch_invariant(engine):
        assert got.ids == want.ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        return
    assert len(got.ids) == len(want.ids) and got.finish == want.finish == "length"
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in got.logprobs)


class EngineContract:
    """The behaviour callers of any RolloutEngine rely on."""

    @pytest.fixture
    def make(self, contract_target: ContractTarget):
        made = []

        def make():
            made.append(contract_target.make_engine())
            return made[-1]

        yield make
        for engine in made:
            engine.close()

    @pytest.fixture
    def v(self, contract_target: ContractTarget) -> int:
        return contract_target.weight_version

    def test_is_a_rollout_engine(self, make):
        assert isinstance(make(), RolloutEngine)

    def test_streams_every_sample_to_its_end(self, make, v, contract_target):
        engine = make()
        states = [make_state(i, v, prompt_len=3 + i, max_new=10 + i) for i in range(4)]
        out = run_alone(engine, states)
        for s in states:
            c = out[s.sample_id]
            assert c.finish == "length" and len(c.ids) == s.params.max_new_tokens
            assert all(0 <= t < contract_target.vocab_size for t in c.ids)
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in c.logprobs)
            assert c.versions == {v}
        assert engine.poll(0.0) == []

    def test_tokens_do_not_depend_on_batch_composition(self, make, v):
        target = make_state(100, v, max_new=24, temperature=0.8, top_p=0.9)
        alone = run_alone(make(), [target])[100]
        crowd = [make_state(i, v, prompt_len=2 + 3 * i, max_new=30) for i in range(6)]
        engine = make()
        engine.submit(crowd[:3])
        engine.submit([target, *crowd[3:]])
        mixed = collect(engine, [100, *range(6)])[100]
        assert_same_or_whole(engine, mixed, alone)

    def test_seed_decides_sampled_tokens_and_not_greedy_ones(self, make, v):
        engine = make()
        a = run_alone(engine, [make_state(1, v, max_new=16, seed=1)])[1].ids
        other_id = run_alone(engine, [make_state(2, v, max_new=16, seed=1, prompt_of=1)])[2].ids
        other_seed = run_alone(engine, [make_state(3, v, max_new=16, seed=2, prompt_of=1)])[3].ids
        assert other_id != a and other_seed != a  # sample id and seed both enter the draw
        assert run_alone(make(), [make_state(1, v, max_new=16, seed=1)])[1].ids == a
        g1 = run_alone(engine, [make_state(4, v, temperature=0.0, seed=1)])[4].ids
        g2 = run_alone(engine, [make_state(5, v, temperature=0.0, seed=9, prompt_of=4)])[5].ids
        assert g1 == g2

    def test_max_new_tokens_and_stop_tokens(self, make, v):
        engine = make()
        free = run_alone(engine, [make_state(1, v, max_new=20)])[1]
        assert free.finish == "length" and len(free.ids) == 20
        k = max(i for i in range(20) if free.ids[i] not in free.ids[:i])  # last first occurrence
        stop = (free.ids[k], contract_unused_id(free.ids))
        stopped = run_alone(engine, [make_state(1, v, max_new=20, stop=stop)])[1]
        assert stopped.finish == "stop"
        assert stopped.ids == free.ids[:k + 1]

    def test_resumed_state_continues_where_it_stopped(self, make, v):
        full = run_alone(make(), [make_state(1, v, max_new=20)])[1]
        resumed = make_state(1, v, max_new=20, output=tuple(full.ids[:7]), logprobs=tuple(full.logprobs[:7]))
        engine = make()
        engine.submit([resumed])
        out = {1: Collected(ids=list(full.ids[:7]), logprobs=list(full.logprobs[:7]))}
        collect(engine, [1], out)
        assert_same_or_whole(engine, out[1], full)

    def test_abort_drops_samples(self, make, v):
        engine = make()
        engine.submit([make_state(1, v, max_new=400), make_state(2, v, max_new=30)])
        out: dict[int, Collected] = {}
        poll_until(engine, out, lambda o: 1 in o)
        engine.abort([1, 12345])
        collect(engine, [2], out)
        seen = len(out[1].ids)
        absorb(out, engine.poll(0.0))
        assert len(out[1].ids) == seen and out[1].finish is None
        load = engine.load()
        assert load.running == 0 and load.queued == 0

    def _migrate(self, make, v, with_kv: bool):
        states = [make_state(i, v, prompt_len=4 + 5 * i, max_new=40, temperature=0.9) for i in range(3)]
        reference = run_alone(make(), states)
        source, dest = make(), make()
        source.submit(states)
        out: dict[int, Collected] = {}
        poll_until(source, out, lambda o: all(len(o.get(i, Collected()).ids) >= 3 for i in range(3)))
        batch = source.export_states([0, 1, 2, 777], with_kv=with_kv)
        assert [s.sample_id for s in batch.states] == [0, 1, 2]
        for s in batch.states:  # every generated token is in the state, polled or not
            assert list(s.output_ids[:len(out[s.sample_id].ids)]) == out[s.sample_id].ids
            assert not s.finished and s.weight_version == v
            out[s.sample_id] = Collected(ids=list(s.output_ids), logprobs=list(s.output_logprobs))
        assert source.poll(0.0) == [] and source.load().running == 0
        if with_kv:
            assert batch.kv_layout is not None
            assert all(0 <= t <= s.position for t, s in zip(batch.kv_tokens, batch.states))
        dest.import_states(unpack_batch(pack_batch(batch)))
        collect(dest, [0, 1, 2], out)
        for i in range(3):
            assert_same_or_whole(dest, out[i], reference[i])

    def test_export_import_tokens_only(self, make, v):
        self._migrate(make, v, with_kv=False)

    def test_export_import_with_kv(self, make, v, contract_target):
        engine = make()
        assert exports_kv(engine) == contract_target.supports_kv
        if exports_kv(engine):
            self._migrate(make, v, with_kv=True)
            return
        engine.submit([make_state(i, v, max_new=300) for i in range(2)])
        with pytest.raises(RolloutError):  # refused whole: the samples stay where they are
            engine.export_states([0, 1], with_kv=True)
        assert sorted(s.sample_id for s in engine.export_states([0, 1]).states) == [0, 1]

    def test_export_all_and_subset(self, make, v):
        engine = make()
        engine.submit([make_state(i, v, max_new=300) for i in range(3)])
        first = engine.export_states([1])
        assert [s.sample_id for s in first.states] == [1] and not first.has_kv
        rest = engine.export_states()
        assert sorted(s.sample_id for s in rest.states) == [0, 2]
        assert engine.export_states().states == ()
        assert engine.load().running + engine.load().queued == 0

    def test_load_weights_waits_for_an_empty_engine(self, make, v, contract_target):
        engine = make()
        engine.submit([make_state(1, v, max_new=200)])
        with pytest.raises(EngineBusy):  # typed: an instance waits on it instead of failing
            engine.load_weights(contract_target.weights(), v + 1)
        assert engine.load().weight_version == v
        engine.abort([1])
        engine.load_weights(contract_target.weights(), v + 1)
        assert engine.load().weight_version == v + 1

    def test_new_weights_tag_and_change_tokens(self, make, v, contract_target):
        engine = make()
        before = run_alone(engine, [make_state(1, v, temperature=0.0, max_new=16)])[1]
        engine.load_weights(contract_target.other_weights(), v + 1)
        with pytest.raises(RolloutError):
            engine.submit([make_state(2, v)])
        after = run_alone(engine, [make_state(3, v + 1, temperature=0.0, max_new=16)])[3]
        assert after.versions == {v + 1}
        assert after.ids != before.ids
        engine.load_weights(contract_target.weights(), v + 2)
        again = run_alone(engine, [make_state(1, v + 2, temperature=0.0, max_new=16)])[1]
        assert again.ids == before.ids and again.versions == {v + 2}

    @pytest.mark.parametrize("bad", ["duplicate_in_batch", "already_admitted", "wrong_version",
                                     "token_out_of_vocab", "finished", "not_a_state"])
    def test_bad_input_is_refused_whole(self, make, v, contract_target, bad):
        engine = make()
        engine.submit([make_state(50, v, max_new=500)])
        good = make_state(1, v)
        bads = {
            "duplicate_in_batch": [good, make_state(1, v)],
            "already_admitted": [good, make_state(50, v)],
            "wrong_version": [good, make_state(2, v + 7)],
            "token_out_of_vocab": [good, RequestState(sample_id=2, prompt_ids=(contract_target.vocab_size,),
                                                      params=SamplingParams(), seed=0, weight_version=v)],
            "finished": [good, make_state(2, v, output=(5,), logprobs=(-1.0,)).extended((), (), "stop")],
            "not_a_state": [good, {"sample_id": 2}],
        }
        with pytest.raises(RolloutError):
            engine.submit(bads[bad])
        load = engine.load()
        assert load.running + load.queued == 1  # nothing of the refused batch got in
        engine.abort([50])
        out = run_alone(engine, [good])
        assert out[1].finish == "length"

    def test_load_reports_admitted_work(self, make, v):
        engine = make()
        assert engine.load().weight_version == v
        engine.submit([make_state(i, v, max_new=1000) for i in range(3)])
        load = engine.load()
        assert load.running + load.queued == 3
        assert 0 < load.queued_tokens <= 3000
        out: dict[int, Collected] = {}
        poll_until(engine, out, lambda o: len(o.get(0, Collected()).ids) >= 8)
        assert engine.load().decode_tokens_per_s > 0
        engine.abort([0, 1, 2])
        load = engine.load()
        assert (load.running, load.queued, load.queued_tokens) == (0, 0, 0)

    def test_closed_engine_refuses_calls(self, make, v):
        engine = make()
        engine.close()
        engine.close()
        with pytest.raises(RolloutError):
            engine.submit([make_state(1, v)])
        with pytest.raises(RolloutError):
            engine.poll(0.0)


def contract_unused_id(ids) -> int:
    """A token id the sample never produced (a stop token that must not fire)."""
    return next(t for t in range(1, 10_000) if t not in ids)
