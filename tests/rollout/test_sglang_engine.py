"""The SGLang adapter: the RolloutEngine contract, what it asks of SGLang and how it reads
the answers, checked against FakeSGLangEngineForTests under each release line's rules
(SGLang itself cannot run here; test_sglang_conformance.py checks against the package)."""

import asyncio
import sys
import time

import pytest
import torch
from engine_contract import (
    Collected,
    ContractTarget,
    EngineContract,
    absorb,
    collect,
    make_state,
    poll_until,
    run_alone,
)
from fake_sglang import FAKES, ShortContextFake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost.errors import RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.models import ModelConfig, load_pretrained
from rlboost.rollout.server.loop_thread import LoopThread
from rlboost.rollout.sglang import weights as sglang_weights
from rlboost.rollout.sglang.engine import SGLangEngine, SGLangEngineConfig
from rlboost.rollout.sglang.requests import SGLangSample, cut_at_stop, finish_of, new_entries, request_id, sampling_seed
from rlboost.rollout.sglang.weights import weight_buckets

VERSION = 3


@pytest.fixture(params=sorted(FAKES))
def release(request) -> str:
    """The SGLang release line whose rules the fake follows."""
    return request.param


@pytest.fixture
def contract_target(tiny_ckpt, tiny_ckpt_other, release):
    config = SGLangEngineConfig(model_path=str(tiny_ckpt), stream_interval=2, weight_version=VERSION)
    return ContractTarget(
        make_engine=lambda: SGLangEngine(config, engine_factory=FAKES[release]),
        vocab_size=ModelConfig.load(tiny_ckpt).vocab_size,
        weight_version=VERSION,
        weights=lambda: load_pretrained(tiny_ckpt).state_dict(),
        other_weights=lambda: load_pretrained(tiny_ckpt_other).named_weights(),
        supports_kv=False,
    )


class TestSGLangEngine(EngineContract):
    pass


# ---- what the adapter asks of SGLang, and how it reads the answers ---------------------


@pytest.fixture
def made():
    """Fakes built by `factory`, so a test can look at what the adapter asked of SGLang."""
    return []


@pytest.fixture
def start(tiny_ckpt, made, release):
    engines = []

    def start(**overrides):
        knobs = {k: overrides.pop(k) for k in ("eos_token_ids", "hold_new_requests", "abort_after_tokens",
                                               "fail_updates", "finish_alone", "busy_flushes", "factory_class")
                 if k in overrides}
        cls = knobs.pop("factory_class", FAKES[release])

        def factory(**kwargs):
            made.append(cls(**kwargs, **knobs))
            return made[-1]

        config = SGLangEngineConfig(model_path=str(tiny_ckpt), **{"stream_interval": 2, "weight_version": VERSION,
                                                                  **overrides})
        engines.append(SGLangEngine(config, engine_factory=factory))
        return engines[-1]

    yield start
    for engine in engines:
        engine.close()


def test_each_sample_is_one_request_resumed_from_prompt_plus_output(start, made):
    engine = start()
    resumed = make_state(7, VERSION, max_new=20, seed=5, stop=(258,), top_k=40, top_p=0.9,
                         output=(11, 12, 13), logprobs=(-1.0, -1.0, -1.0))
    fresh = make_state(8, VERSION, max_new=6, temperature=0.0)
    engine.submit([resumed, fresh])
    collect(engine, [7, 8], {7: Collected(ids=[11, 12, 13], logprobs=[-1.0] * 3)})
    asked = {r["rid"]: r for r in made[0].requests}
    first, second = (asked[r] for r in sorted(asked, key=lambda r: int(r.rsplit("-", 1)[1], 16)))
    assert first["input_ids"] == [*resumed.prompt_ids, 11, 12, 13]
    assert first["sampling_params"] == {
        "max_new_tokens": 17, "temperature": 1.0, "top_p": 0.9, "top_k": 40, "stop_token_ids": [258],
        "ignore_eos": False, "no_stop_trim": True, "sampling_seed": sampling_seed(5, 7)}
    assert (first["return_logprob"], first["logprob_start_len"], first["stream"]) == (True, -1, True)
    assert second["sampling_params"]["ignore_eos"] and second["sampling_params"]["top_k"] == -1
    assert first["rid"] != second["rid"]


def test_sampling_seed_fits_sglang_int32_and_separates_samples():
    seeds = {sampling_seed(seed, sid) for seed in (0, 1, 2**64 - 1) for sid in range(50)}
    assert len(seeds) == 150 and all(0 <= s < 2**31 for s in seeds)


def test_resumed_and_migrated_samples_match_an_uninterrupted_run_on_a_batch_invariant_backend(start):
    """The fake is batch-invariant, so exact equality checks that the adapter re-prefills the
    right tokens at the right positions with the right seed."""
    states = [make_state(i, VERSION, prompt_len=4 + 3 * i, max_new=30, temperature=0.9, top_p=0.95)
              for i in range(3)]
    reference = run_alone(start(), states)
    source, dest = start(), start()
    source.submit(states)
    out: dict[int, Collected] = {}
    poll_until(source, out, lambda o: all(len(o.get(i, Collected()).ids) >= 4 for i in range(3)))
    batch = source.export_states()
    for s in batch.states:
        out[s.sample_id] = Collected(ids=list(s.output_ids), logprobs=list(s.output_logprobs))
    dest.import_states(batch)
    collect(dest, [0, 1, 2], out)
    for i in range(3):
        assert out[i].ids == reference[i].ids and out[i].logprobs == reference[i].logprobs


def test_a_stop_on_the_models_own_eos_is_continued_by_a_new_request(start, made):
    free = run_alone(start(), [make_state(1, VERSION, max_new=24)])[1].ids
    k = next(i for i in range(3, 24) if free[i] not in free[:i])  # its first occurrence
    unused = next(t for t in range(1, 320) if t not in free)
    engine = start(eos_token_ids=(free[k],))  # SGLang stops there; the sample does not
    out = run_alone(engine, [make_state(1, VERSION, max_new=24, stop=(unused,))])[1]
    assert out.ids == free and out.finish == "length"
    second = made[-1].requests[1]
    assert second["input_ids"][-(k + 1):] == free[:k + 1]
    assert second["sampling_params"]["max_new_tokens"] == 24 - (k + 1)


def test_a_stop_token_ends_the_sample_even_when_sglang_reports_length(start):
    free = run_alone(start(), [make_state(1, VERSION, max_new=24)])[1].ids
    k = max(i for i in range(24) if free[i] not in free[:i])
    # SGLang checks the length first: on the last allowed token it reports "length".
    out = run_alone(start(), [make_state(1, VERSION, max_new=k + 1, stop=(free[k],))])[1]
    assert out.ids == free[:k + 1] and out.finish == "stop"


def test_a_finish_sglang_reports_alone_still_reaches_the_caller(start):
    """SGLang may end a sample for a reason of its own (here its context length, shorter than
    the model's) in a chunk without new tokens; the finish must still travel with a token."""
    free = run_alone(start(), [make_state(1, VERSION, max_new=20)])[1].ids
    out = run_alone(start(factory_class=ShortContextFake), [make_state(1, VERSION, max_new=20)])[1]
    assert out.ids == free[:6] and out.finish == "length"  # prompt 6 + 6 tokens


def test_abort_before_sglang_registered_the_request_still_stops_it(start, made):
    engine = start(hold_new_requests=True)
    engine.submit([make_state(1, VERSION, max_new=400)])
    fake = made[0]
    rid = fake.wait_for_requests(1)[0]["rid"]  # sent, not yet registered by SGLang
    engine.abort([1])
    fake.open_admission()
    assert fake.wait_finished(rid)["type"] == "abort"  # not "length": it did not run its 400 tokens
    assert fake.events.count(("abort", rid)) >= 2     # the first abort found nothing to stop
    assert engine.poll(0.0) == [] and engine.load().running + engine.load().queued == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["poll", "move", "abort_and_resume"]), st.integers(0, 3)),
                    max_size=10))
def test_any_schedule_of_moves_and_aborts_ends_every_sample_once_and_whole(start, ops):
    """Samples hop between two adapters by export/import or by abort and resubmission from
    the tokens collected; every one ends exactly once, gap-free, with the tokens of an
    uninterrupted run (the fake is batch-invariant)."""
    states = [make_state(i, VERSION, prompt_len=3 + i, max_new=24, temperature=0.9) for i in range(4)]
    reference = _uninterrupted(start, states)
    engines = [start(), start()]
    try:
        out = _hop(engines, states, ops)
    finally:
        for engine in engines:
            engine.close()
    assert {i: (c.ids, c.finish) for i, c in out.items()} == reference


def _hop(engines, states, ops) -> dict[int, Collected]:
    where = {s.sample_id: 0 for s in states}
    engines[0].submit(states)
    out: dict[int, Collected] = {}
    for op, sid in ops:
        for engine in engines:
            absorb(out, engine.poll(0.0))
        if op == "poll" or out.get(sid, Collected()).finish is not None:
            continue
        src, dst = engines[where[sid]], engines[1 - where[sid]]
        if op == "move":
            moved = src.export_states([sid]).states
            if not moved:  # it finished meanwhile: its last delta is still on the source
                continue
            out[sid] = Collected(ids=list(moved[0].output_ids), logprobs=list(moved[0].output_logprobs))
            dst.import_states(MigrationBatch(states=moved))
        else:
            src.abort([sid])
            c = out.setdefault(sid, Collected())
            dst.submit([states[sid].extended(tuple(c.ids), tuple(c.logprobs))])
        where[sid] = 1 - where[sid]
    deadline = time.monotonic() + 60
    while any(out.get(i, Collected()).finish is None for i in range(4)):
        assert time.monotonic() < deadline
        for engine in engines:
            absorb(out, engine.poll(0.05))
    return out


_REFERENCE: dict = {}


def _uninterrupted(start, states):
    if not _REFERENCE:
        _REFERENCE.update({i: (c.ids, c.finish) for i, c in run_alone(start(), states).items()})
    return _REFERENCE


def test_kv_pages_from_another_engine_are_dropped_and_the_samples_re_prefilled(start, tiny_ckpt):
    from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig

    with EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), weight_version=VERSION)) as embedded:
        embedded.submit([make_state(i, VERSION, max_new=40) for i in range(2)])
        out: dict[int, Collected] = {}
        poll_until(embedded, out, lambda o: all(len(o.get(i, Collected()).ids) >= 2 for i in range(2)))
        batch = embedded.export_states(with_kv=True)
    assert batch.has_kv
    engine = start()
    engine.import_states(batch)
    out = {s.sample_id: Collected(ids=list(s.output_ids), logprobs=list(s.output_logprobs)) for s in batch.states}
    collect(engine, [0, 1], out)
    assert all(len(c.ids) == 40 and c.finish == "length" for c in out.values())


# ---- weights -------------------------------------------------------------------------


def _greedy(engine, sid: int, version: int) -> list[int]:
    return run_alone(engine, [make_state(sid, version, temperature=0.0, max_new=16)])[sid].ids


def _control(fake) -> list[str]:
    return [e[0] for e in fake.events if e[0] != "abort"]


def test_load_weights_asks_each_release_for_what_it_needs(start, made, release, tiny_ckpt_other):
    engine = start()
    engine.load_weights(load_pretrained(tiny_ckpt_other).named_weights(), VERSION + 1)
    session = ["begin_weight_update", "update_weights_from_tensor", "end_weight_update"]
    update = session if release == "0.5.21" else ["update_weights_from_tensor"]
    assert _control(made[0]) == [*update, "flush_cache"]
    assert all(e[2] is False for e in made[0].events if e[0] == "update_weights_from_tensor")  # one flush
    assert engine.load().weight_version == VERSION + 1


def test_the_old_call_order_fails_on_0_5_21_as_sglang_does(start, made, release, tiny_ckpt_other, monkeypatch):
    """Before 0.5.21-aware loading, update_weights_from_tensor ran without a session: SGLang
    0.5.21+ answers (False, "... must run between begin_weight_update() and
    end_weight_update()") and the engine fails; on 0.5.9 the same calls load."""
    monkeypatch.setattr(sglang_weights, "has_update_session", lambda engine: False)
    engine = start()
    other = load_pretrained(tiny_ckpt_other).named_weights()
    if release == "0.5.9":
        engine.load_weights(other, VERSION + 1)
        assert engine.load().weight_version == VERSION + 1
        return
    with pytest.raises(RolloutError, match=r"between begin_weight_update\(\) and end_weight_update\(\)"):
        engine.load_weights(other, VERSION + 1)
    with pytest.raises(RolloutError, match="failed"):
        engine.poll(0.0)


def test_a_flush_sglang_refuses_is_retried_until_it_is_idle(start, made, tiny_ckpt_other):
    """SGLang refuses flush_cache while its scheduler still holds a batch (requests aborted a
    moment ago): one try, as before, left the engine failed."""
    engine = start(busy_flushes=3)
    engine.load_weights(load_pretrained(tiny_ckpt_other).named_weights(), VERSION + 1)
    assert [e[1] for e in made[0].events if e[0] == "flush_cache"] == [False, False, False, True]
    assert engine.load().weight_version == VERSION + 1


def test_a_scheduler_that_never_goes_idle_fails_the_load_within_its_bound(start, tiny_ckpt_other):
    engine = start(busy_flushes=10**9, flush_timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(RolloutError, match="flush_timeout_s"):
        engine.load_weights(load_pretrained(tiny_ckpt_other).named_weights(), VERSION + 1)
    assert time.monotonic() - t0 < 30
    with pytest.raises(RolloutError, match="failed"):
        engine.poll(0.0)


def test_weights_load_right_after_an_abort_while_sglang_drains_it(start, made, tiny_ckpt_other):
    engine = start()
    engine.submit([make_state(i, VERSION, max_new=400) for i in range(3)])
    poll_until(engine, {}, lambda o: len(o) == 3)
    engine.abort([0, 1, 2])
    engine.load_weights(load_pretrained(tiny_ckpt_other).named_weights(), VERSION + 1)  # no wait in between
    assert all(made[0].wait_finished(r["rid"])["type"] == "abort" for r in made[0].requests)
    assert run_alone(engine, [make_state(5, VERSION + 1)])[5].versions == {VERSION + 1}


def test_request_ids_are_never_prefixes_of_each_other():
    """SGLang aborts every request whose rid starts with the one given."""
    rids = sorted(request_id("rlboost-0a1b2c3d", serial, sid) for serial in range(1, 300) for sid in range(-12, 120))
    assert len(set(rids)) == len(rids)
    # In sorted order a string that is a prefix of any other is a prefix of its successor.
    assert not any(b.startswith(a) for a, b in zip(rids, rids[1:]))


def test_one_samples_requests_never_abort_each_other(start, made):
    engine = start()
    engine.submit([make_state(1, VERSION, max_new=300)])
    for i in range(11):  # 12 requests for sample 1, serials 1 to 12 (1 vs 10, 11, 12)
        made[0].wait_for_requests(i + 1)
        batch = engine.export_states([1])
        engine.import_states(batch)
    state = batch.states[0]
    out = collect(engine, [1], {1: Collected(ids=list(state.output_ids), logprobs=list(state.output_logprobs))})
    assert out[1].finish == "length" and len(out[1].ids) == 300
    rids = [r["rid"] for r in made[0].requests]
    assert len(rids) == 12 and not any(a != b and b.startswith(a) for a in rids for b in rids)


def test_weight_views_reach_sglang_and_the_callers_buffer_stays_put(start, tiny_ckpt, tiny_ckpt_other):
    """Pickling a CPU tensor for SGLang's scheduler moves its storage to shared memory: the
    adapter must hand over copies, not the caller's staging buffer."""
    other = load_pretrained(tiny_ckpt_other).named_weights()
    staging = torch.empty(sum(t.numel() for t in other.values()))
    views, offset = {}, 0
    for name, t in other.items():
        views[name] = staging[offset:offset + t.numel()].view(t.shape)
        views[name].copy_(t)
        offset += t.numel()
    address = staging.data_ptr()
    engine = start()
    engine.load_weights(views, VERSION + 1)
    assert staging.data_ptr() == address and not staging.untyped_storage().is_shared()
    expected = start()
    expected.load_weights(other, VERSION + 1)
    assert _greedy(engine, 1, VERSION + 1) == _greedy(expected, 1, VERSION + 1)


@pytest.mark.parametrize("bad", ["unknown_name", "missing_name", "wrong_shape", "integer_tensor", "not_a_tensor"])
def test_weights_that_do_not_fit_are_refused_before_sglang_sees_them(start, made, tiny_ckpt, bad):
    engine = start()
    good = load_pretrained(tiny_ckpt).named_weights()
    name = "model.norm.weight"
    broken = dict(good)
    if bad == "unknown_name":
        broken["model.layers.9.mlp.up_proj.weight"] = good[name]
    elif bad == "missing_name":
        del broken[name]
    elif bad == "wrong_shape":
        broken[name] = torch.ones(good[name].numel() + 1)
    elif bad == "integer_tensor":
        broken[name] = torch.ones(good[name].shape, dtype=torch.int64)
    else:
        broken[name] = [1.0] * good[name].numel()
    with pytest.raises(RolloutError):
        engine.load_weights(broken, VERSION + 1)
    assert not [e for e in made[0].events if e[0] in ("begin_weight_update", "update_weights_from_tensor")]
    assert engine.load().weight_version == VERSION
    assert run_alone(engine, [make_state(1, VERSION)])[1].finish == "length"  # still usable


def test_a_failed_update_inside_sglang_leaves_the_engine_failed(start, made, tiny_ckpt):
    engine = start(fail_updates=True)
    with pytest.raises(RolloutError, match="illegal memory access"):
        engine.load_weights(load_pretrained(tiny_ckpt).named_weights(), VERSION + 1)
    assert not made[0].session_open  # closed, so SGLang would take the next load
    with pytest.raises(RolloutError, match="failed"):  # its weights are unknown now
        engine.poll(0.0)


def test_weight_buckets_split_by_size_and_copy_cpu_tensors():
    base = torch.arange(40.0)
    pairs = [(f"w{i}", base[10 * i:10 * i + 10]) for i in range(4)]  # 40 bytes each
    buckets = list(weight_buckets(pairs, bucket_bytes=100, dtype="bfloat16"))
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1", "w2", "w3"]]  # bf16: 20 bytes each
    buckets = list(weight_buckets(pairs, bucket_bytes=100))
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2", "w3"]]
    for name, t in (p for b in buckets for p in b):
        assert t.untyped_storage().nbytes() == 40 and t.data_ptr() != base.data_ptr()
        assert torch.equal(t, dict(pairs)[name])


# ---- failures, memory, configuration -------------------------------------------------


def test_an_abort_sglang_did_on_its_own_fails_the_engine_loudly(start):
    engine = start(abort_after_tokens=5)
    engine.submit([make_state(1, VERSION, max_new=50)])
    with pytest.raises(RolloutError, match="KV cache exhausted"):
        collect(engine, [1])
    with pytest.raises(RolloutError):
        engine.submit([make_state(2, VERSION)])


def test_memory_release_waits_for_an_empty_engine_and_blocks_generation(start, made):
    engine = start()
    engine.submit([make_state(1, VERSION, max_new=300)])
    with pytest.raises(RolloutError, match="in flight"):
        engine.release_memory()
    engine.abort([1])
    engine.release_memory()  # at once: SGLang asserts it is idle, so the abort must drain first
    with pytest.raises(RolloutError, match="released"):
        engine.submit([make_state(2, VERSION)])
    engine.resume_memory()
    assert run_alone(engine, [make_state(2, VERSION)])[2].finish == "length"
    assert [e[0] for e in made[0].events if "memory" in e[0]] == ["release_memory_occupation",
                                                                   "resume_memory_occupation"]


def test_incremental_streaming_output_gives_the_same_tokens(start, release):
    if not FAKES[release].rules.incremental_streaming:
        with pytest.raises(RolloutError, match="incremental_streaming_output"):  # no such ServerArgs field
            start(extra_engine_kwargs={"incremental_streaming_output": True})
        return
    states = [make_state(i, VERSION, max_new=15 + i) for i in range(3)]
    cumulative = run_alone(start(), states)
    incremental = run_alone(start(extra_engine_kwargs={"incremental_streaming_output": True}), states)
    assert {i: c.ids for i, c in incremental.items()} == {i: c.ids for i, c in cumulative.items()}


def test_a_misspelled_engine_argument_fails_construction_clearly(tiny_ckpt):
    config = SGLangEngineConfig(model_path=str(tiny_ckpt), extra_engine_kwargs={"attention_backnd": "fa3"})
    with pytest.raises(RolloutError, match="attention_backnd"):
        SGLangEngine(config, engine_factory=FAKES["0.5.21"])


def test_without_sglang_the_error_names_the_extra(tiny_ckpt, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'rlboost\[sglang\]'"):
        SGLangEngine(SGLangEngineConfig(model_path=str(tiny_ckpt)))


@pytest.mark.parametrize("field, value", [("tp_size", 0), ("stream_interval", 0), ("mem_fraction_static", 1.0),
                                          ("dtype", "fp8"), ("max_model_len", 1), ("weight_bucket_bytes", 10),
                                          ("rate_window_s", 0.0), ("flush_timeout_s", float("inf")),
                                          ("weight_version", -1), ("model_path", "")])
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SGLangEngineConfig(**{"model_path": "/ckpt", field: value})


def test_config_sets_the_server_arguments_the_adapter_relies_on():
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        SGLangEngineConfig(model_path="/ckpt", extra_engine_kwargs={"skip_tokenizer_init": False})
    kwargs = SGLangEngineConfig(model_path="/ckpt", max_model_len=2048, deterministic_inference=False,
                                extra_engine_kwargs={"random_seed": 3}).engine_kwargs()
    assert kwargs["skip_tokenizer_init"] is True and kwargs["enable_deterministic_inference"] is False
    assert kwargs["context_length"] == 2048 and kwargs["random_seed"] == 3


def test_loop_thread_serves_engines_that_bind_the_threads_current_loop():
    class BindsCurrentLoop:  # as SGLang versions that call asyncio.get_event_loop() do
        def __init__(self):
            self.loop = asyncio.get_event_loop()

        def run(self, coro):
            return self.loop.run_until_complete(coro)

    async def answer():
        return 42

    thread = LoopThread(BindsCurrentLoop, name="test-loop-thread")
    assert thread.call(lambda: thread.owned.run(answer())) == 42  # a synchronous call between turns
    thread.stop(lambda: thread.loop.close())
    with pytest.raises(RolloutError, match="closed"):
        thread.call(lambda: 1)


# ---- reading SGLang's chunks ---------------------------------------------------------


def _sample(stop=(), max_new=10, have=0):
    sample = SGLangSample(state=make_state(1, 0, max_new=max_new, stop=stop), rid="r")
    sample.ids, sample.logprobs = list(range(have)), [-1.0] * have
    return sample


def test_chunks_are_read_cumulative_or_incremental():
    sample = _sample(have=2)
    entries = [(-0.1 * i, i, None) for i in range(5)]
    assert new_entries(sample, {"completion_tokens": 5, "output_token_logprobs": entries}) == \
        [(2, -0.2), (3, -0.30000000000000004), (4, -0.4)]
    assert new_entries(sample, {"completion_tokens": 5, "output_token_logprobs": entries[2:]}) == \
        [(2, -0.2), (3, -0.30000000000000004), (4, -0.4)]
    with pytest.raises(RolloutError, match="4 logprob entries for 5 tokens"):
        new_entries(sample, {"completion_tokens": 5, "output_token_logprobs": entries[1:]})
    with pytest.raises(RolloutError, match="lacks completion_tokens"):
        new_entries(sample, {"output_token_logprobs": entries})


def test_finish_reasons_map_to_the_samples_finish():
    sample = _sample(stop=(7,), max_new=10, have=3)
    assert finish_of(sample, None) is None
    assert finish_of(sample, {"type": "length", "length": 10}) == "length"
    assert finish_of(sample, {"type": "stop", "matched": 7}) == "stop"
    assert finish_of(sample, {"type": "stop", "matched": 9}) == "continue"  # the model's EOS
    assert finish_of(_sample(max_new=3, have=3), {"type": "stop", "matched": 9}) == "length"
    for reason in ({"type": "abort", "message": "oom"}, {"type": "stop", "matched": "NaN happened"}, "stop"):
        with pytest.raises(RolloutError):
            finish_of(sample, reason)
    assert cut_at_stop(sample, [(1, -1.0), (7, -1.0), (8, -1.0)]) == ([(1, -1.0), (7, -1.0)], "stop")
    assert cut_at_stop(sample, [(1, -1.0)] * 9) == ([(1, -1.0)] * 7, "length")
    assert cut_at_stop(sample, [(1, -1.0)] * 2) == ([(1, -1.0)] * 2, None)
