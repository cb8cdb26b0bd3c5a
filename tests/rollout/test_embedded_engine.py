"""Behaviour specific to the embedded engine: streaming cadence, cache pressure, in-place
weight loading, config checks, threads."""

import threading

import numpy as np
import pytest
import torch
from engine_contract import Collected, absorb, collect, make_state, run_alone

from rlboost.errors import RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.layout import KVLayout
from rlboost.models import load_pretrained
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig


@pytest.fixture
def engine_for(tiny_ckpt):
    made = []

    def make(**overrides):
        made.append(EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), **overrides)))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def test_deltas_are_released_every_stream_interval_tokens(engine_for):
    engine = engine_for(stream_interval=5)
    engine.submit([make_state(1, 0, max_new=23)])
    deltas = []
    while not deltas or deltas[-1].finish_reason is None:
        deltas += engine.poll(5.0)
    assert all(len(d.ids) % 5 == 0 for d in deltas[:-1])
    assert deltas[-1].start + len(deltas[-1].ids) == 23 and deltas[-1].finish_reason == "length"


def test_cache_pressure_and_small_batches_do_not_change_tokens(engine_for):
    states = [make_state(i, 0, prompt_len=3 + 2 * i, max_new=30, temperature=0.9) for i in range(8)]
    roomy = run_alone(engine_for(), states)
    # 12 blocks of 4 tokens cannot hold three 30-to-47-token samples: running samples evict
    # each other and are re-prefilled, 5 prompt tokens per step, 3 at a time.
    engine = engine_for(num_blocks=12, block_size=4, max_batch_size=3, max_prefill_tokens=5)
    tight = run_alone(engine, states)
    assert engine._sched.evictions > 0
    for s in states:
        assert tight[s.sample_id].ids == roomy[s.sample_id].ids
        assert tight[s.sample_id].logprobs == pytest.approx(roomy[s.sample_id].logprobs, abs=1e-5)


def test_samples_longer_than_the_engine_allows_are_refused(engine_for):
    engine = engine_for(num_blocks=4, block_size=4)
    assert engine.max_model_len == 16
    with pytest.raises(RolloutError, match="max_model_len"):
        engine.submit([make_state(1, 0, prompt_len=6, max_new=11)])
    out = run_alone(engine, [make_state(2, 0, prompt_len=6, max_new=10)])
    assert len(out[2].ids) == 10


def test_load_weights_copies_in_place_from_views(engine_for, tiny_ckpt, tiny_ckpt_other):
    engine = engine_for()
    params = dict(engine._model.named_parameters())
    addresses = {n: p.data_ptr() for n, p in params.items()}
    other = load_pretrained(tiny_ckpt_other).named_weights()
    # one flat buffer with a view per tensor, as a weight puller hands them out
    flat = torch.cat([t.reshape(-1) for t in other.values()])
    views, offset = {}, 0
    for name, t in other.items():
        views[name] = flat[offset:offset + t.numel()].view(t.shape)
        offset += t.numel()
    views["model.norm.weight"] = views["model.norm.weight"].numpy()  # numpy arrays work too
    engine.load_weights(views, 1)
    for name, p in params.items():
        assert p.data_ptr() == addresses[name]
        assert torch.equal(p, other[name])


@pytest.mark.parametrize("damage", ["unknown", "missing", "shape", "integer", "version"])
def test_refused_weights_leave_the_model_untouched(engine_for, tiny_ckpt_other, damage):
    engine = engine_for()
    before = run_alone(engine, [make_state(1, 0, temperature=0.0)])[1].ids
    weights = dict(load_pretrained(tiny_ckpt_other).named_weights())
    version = 1
    if damage == "unknown":
        weights["model.layers.9.mlp.up_proj.weight"] = torch.zeros(1)
    elif damage == "missing":
        weights.pop("model.layers.1.mlp.up_proj.weight")
    elif damage == "shape":
        weights["model.norm.weight"] = torch.zeros(3)
    elif damage == "integer":
        weights["model.norm.weight"] = torch.zeros(64, dtype=torch.int64)
    else:
        version = -1
    with pytest.raises(RolloutError):
        engine.load_weights(weights, version)
    assert engine.load().weight_version == 0
    assert run_alone(engine, [make_state(2, 0, temperature=0.0, prompt_of=1)])[2].ids == before


def test_kv_pages_of_another_model_shape_are_refused(engine_for):
    engine = engine_for()
    state = make_state(1, 0, output=(5,), logprobs=(-1.0,))
    wrong = KVLayout(num_layers=3, num_kv_heads=2, head_dim=16, block_size=16, dtype="float32")
    batch = MigrationBatch(states=(state,), kv_layout=wrong, kv_tokens=(2,),
                           kv_data=(torch.zeros(2 * wrong.token_bytes, dtype=torch.uint8),))
    with pytest.raises(RolloutError, match="num_layers"):
        engine.import_states(batch)
    with pytest.raises(RolloutError, match="MigrationBatch"):
        engine.import_states([state])
    assert engine.load().queued + engine.load().running == 0


def test_pages_covering_the_last_token_are_accepted(engine_for):
    """kv_tokens == position (the last token's K/V included) resumes like position - 1."""
    source = engine_for(stream_interval=1)
    reference = run_alone(engine_for(), [make_state(1, 0, max_new=20)])[1]
    source.submit([make_state(1, 0, max_new=20)])
    out: dict[int, Collected] = {}
    while len(out.get(1, Collected()).ids) < 5:
        absorb(out, source.poll(5.0))
    batch = source.export_states([1], with_kv=True)
    state, tokens = batch.states[0], batch.kv_tokens[0]
    assert tokens == state.position - 1
    layout = batch.kv_layout
    # pages are [layer][k/v][token][...]: give every (layer, k/v) one more token slot
    pages = batch.kv_data[0].view(torch.float32).view(layout.num_layers, 2, tokens, -1)
    padded = torch.cat([pages, torch.zeros_like(pages[:, :, :1])], dim=2).reshape(-1).view(torch.uint8)
    dest = engine_for()
    dest.import_states(MigrationBatch(states=(state,), kv_layout=batch.kv_layout,
                                      kv_tokens=(state.position,), kv_data=(padded,)))
    resumed = collect(dest, [1], {1: Collected(ids=list(state.output_ids))})[1]
    assert resumed.ids == reference.ids


def test_public_methods_are_thread_safe(engine_for):
    states = [make_state(i, 0, prompt_len=2 + i, max_new=16) for i in range(16)]
    reference = run_alone(engine_for(), states)
    engine = engine_for(stream_interval=3)
    out: dict[int, Collected] = {}
    errors = []

    def submit(part):
        try:
            engine.submit(part)
            engine.load()
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=submit, args=(states[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    collect(engine, [s.sample_id for s in states], out)
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert {sid: c.ids for sid, c in out.items()} == {sid: c.ids for sid, c in reference.items()}


class _ConditionSignallingPollerForTests(threading.Condition):
    """A condition variable that tells the test when the poller thread has started waiting."""

    poller_waits = threading.Event()

    def wait(self, timeout=None):
        if threading.current_thread().name == "poller":
            self.poller_waits.set()  # the lock is still held: close() cannot run before the wait
        return super().wait(timeout)


def test_close_wakes_a_waiting_poll(engine_for, monkeypatch):
    with monkeypatch.context() as patch:  # only the engine built here gets the signalling condition
        patch.setattr(threading, "Condition", _ConditionSignallingPollerForTests)
        engine = engine_for()
    raised = threading.Event()

    def wait():
        try:
            engine.poll(60.0)
        except RolloutError:
            raised.set()

    poller = threading.Thread(target=wait, name="poller")
    poller.start()
    assert _ConditionSignallingPollerForTests.poller_waits.wait(10.0), "poll never started waiting"
    engine.close()
    poller.join(timeout=10)
    assert raised.is_set()


def test_max_model_len_must_fit_the_cache(engine_for):
    with pytest.raises(ValueError, match="num_blocks"):
        engine_for(num_blocks=4, block_size=4, max_model_len=17)
    assert engine_for(num_blocks=4, block_size=4, max_model_len=12).max_model_len == 12
    assert engine_for(num_blocks=4, block_size=4).max_model_len == 16  # default: what the cache holds


def test_abort_drops_the_last_delta_of_a_sample_that_finished_unpolled(engine_for):
    engine = engine_for(stream_interval=100)
    engine.submit([make_state(1, 0, prompt_len=3, max_new=2), make_state(2, 0, max_new=50)])
    # Commands run between engine steps, so each call that returns lets one more step run:
    # after four of them sample 1 (one prefill step, one decode step) has finished unpolled.
    for _ in range(4):
        engine.abort([])
    assert engine.load().running == 1
    engine.abort([1])
    out: dict[int, Collected] = {}
    collect(engine, [2], out)
    assert 1 not in out


@pytest.mark.parametrize("field, value", [
    ("device", "no-such-device"), ("dtype", "float64"), ("num_blocks", 0), ("block_size", 0),
    ("max_batch_size", 0), ("max_prefill_tokens", 0), ("stream_interval", 0), ("max_model_len", 1),
    ("weight_version", -1), ("rate_window_s", 0.0),
])
def test_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        EmbeddedEngineConfig(model_dir="x", **{field: value})


def test_engine_needs_a_model():
    with pytest.raises(ValueError, match="model_dir"):
        EmbeddedEngine(EmbeddedEngineConfig())
    with pytest.raises(FileNotFoundError):
        EmbeddedEngine(EmbeddedEngineConfig(model_dir="/nonexistent/checkpoint"))


def test_poll_rejects_negative_timeouts(engine_for):
    with pytest.raises(ValueError):
        engine_for().poll(-1.0)
    assert np.isfinite(engine_for().load().decode_tokens_per_s)
