"""Emulated rollout instances: their engine takes the model's vocabulary and stop token
(so the trainer can score what it emits), and preemptible ones run at their own speed."""

from __future__ import annotations

import json

import pytest

from rlboost.errors import EngineBusy
from rlboost.migration.state import RequestState, SamplingParams
from rlboost.models import ByteTokenizer, build_tiny_checkpoint
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.emulated import EmulatedEngine, EmulatedEngineConfig
from rlboost.rollout.emulated.fitting import fitted_to
from rlboost.rollout.factory import build_engine

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", vocab_size=320)


def _engine(model_dir, kind="reserved", emulated=None) -> EmulatedEngine:
    rollout = RolloutConfig(backend="emulated", emulated=emulated or EmulatedEngineConfig())
    return build_engine(rollout, model_dir=str(model_dir), kind=kind)


def test_vocabulary_and_stop_token_come_from_the_checkpoint(checkpoint):
    config = fitted_to(EmulatedEngineConfig(), str(checkpoint))
    # the embedding table has 320 rows, the byte tokenizer decodes 259 ids
    assert config.vocab_size == TOK.vocab_size and config.eos_token_id == TOK.eos_id
    assert config.max_model_len == json.loads((checkpoint / "config.json").read_text())["max_position_embeddings"]


def test_samples_stop_at_the_tasks_stop_token(checkpoint):
    engine = _engine(checkpoint, emulated=EmulatedEngineConfig(
        stop_probability=1.0, sample_tokens_per_s=1e6, decode_tokens_per_s=1e6))
    assert isinstance(engine, EmulatedEngine)
    engine.load_weights({}, version=0)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(TOK.eos_id,))
    engine.submit([RequestState(sample_id=1, prompt_ids=tuple(TOK.encode("1+2=")), params=params, seed=0,
                                weight_version=0)])
    deltas = []
    while not deltas or deltas[-1].finish_reason is None:
        deltas += engine.poll(1.0)
    assert [i for d in deltas for i in d.ids] == [TOK.eos_id] and deltas[-1].finish_reason == "stop"
    engine.close()


def test_without_a_tokenizer_the_models_config_decides(tmp_path, checkpoint):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((checkpoint / "config.json").read_text())
    config = fitted_to(EmulatedEngineConfig(), str(bare))
    assert config.vocab_size == 320 and config.eos_token_id == TOK.eos_id
    hf = json.loads((checkpoint / "config.json").read_text())
    hf["eos_token_id"] = None
    (bare / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="end-of-sequence"):
        fitted_to(EmulatedEngineConfig(), str(bare))


def test_preemptible_instances_run_at_their_own_speed(checkpoint):
    base = EmulatedEngineConfig(decode_tokens_per_s=3000.0, sample_tokens_per_s=60.0, prefill_tokens_per_s=9000.0,
                                preemptible_speed=0.5)
    reserved = _engine(checkpoint, "reserved", base).config
    spot = _engine(checkpoint, "preemptible", base).config
    assert (reserved.decode_tokens_per_s, reserved.sample_tokens_per_s) == (3000.0, 60.0)
    assert (spot.decode_tokens_per_s, spot.sample_tokens_per_s, spot.prefill_tokens_per_s) == (1500.0, 30.0, 4500.0)
    assert spot.stop_probability == base.stop_probability
    derived = _engine(checkpoint, "preemptible", EmulatedEngineConfig(decode_tokens_per_s=6400.0,
                                                                       preemptible_speed=0.5)).config
    assert derived.sample_tokens_per_s is None and derived.per_sample_tokens_per_s == 3200.0 / derived.max_running


def test_a_bad_speed_is_refused():
    with pytest.raises(ValueError, match="preemptible_speed"):
        EmulatedEngineConfig(preemptible_speed=0.0)


def test_weights_load_only_into_an_engine_that_holds_no_sample(checkpoint):
    """A finished sample stays in the engine until polled, though load() counts it neither
    running nor queued: load_weights refuses with EngineBusy, changing nothing, until then."""
    engine = _engine(checkpoint, emulated=EmulatedEngineConfig(sample_tokens_per_s=1e6, decode_tokens_per_s=1e6))
    engine.load_weights({}, version=0)
    engine.submit([RequestState(sample_id=1, prompt_ids=(1, 2), params=SamplingParams(max_new_tokens=2), seed=0,
                                weight_version=0)])
    load = engine.load()
    assert load.running + load.queued == 0
    with pytest.raises(EngineBusy, match="1 samples"):
        engine.load_weights({}, version=1)
    assert engine.load().weight_version == 0
    assert [d.finish_reason for d in engine.poll(1.0)][-1] is not None
    engine.load_weights({}, version=1)
    assert engine.load().weight_version == 1
    engine.close()
