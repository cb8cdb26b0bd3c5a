"""Emulated rollout instances: their engine takes the model's vocabulary and stop token
(so the trainer can score what it emits), and preemptible ones run at their own speed."""

from __future__ import annotations

import json

import pytest

from rlboost.cluster.instance import InstanceSpec, build_engine, emulated_config
from rlboost.migration.state import RequestState, SamplingParams
from rlboost.models import ByteTokenizer, build_tiny_checkpoint
from rlboost.rollout.emulated.engine import EmulatedEngine, EmulatedEngineConfig
from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.rollout.sglang.config import SGLangEngineConfig
from rlboost.transfer import TransferConfig

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", vocab_size=320)


def _spec(model_dir, kind="reserved", speed=1.0, emulated=None):
    return InstanceSpec(instance_id=f"{kind}-0", kind=kind, capacity=8,
                        engine=EmbeddedEngineConfig(model_dir=str(model_dir)), transfer=TransferConfig(),
                        sources=("127.0.0.1:1",), emulated=emulated or EmulatedEngineConfig(),
                        emulated_preemptible_speed=speed)


def test_vocabulary_and_stop_token_come_from_the_checkpoint(checkpoint):
    config = emulated_config(_spec(checkpoint))
    # the embedding table has 320 rows, the byte tokenizer decodes 259 ids
    assert config.vocab_size == TOK.vocab_size and config.eos_token_id == TOK.eos_id
    assert config.max_model_len == json.loads((checkpoint / "config.json").read_text())["max_position_embeddings"]


def test_samples_stop_at_the_tasks_stop_token(checkpoint):
    engine = build_engine(_spec(checkpoint, emulated=EmulatedEngineConfig(
        stop_probability=1.0, sample_tokens_per_s=1e6, decode_tokens_per_s=1e6)))
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
    config = emulated_config(_spec(bare))
    assert config.vocab_size == 320 and config.eos_token_id == TOK.eos_id
    hf = json.loads((checkpoint / "config.json").read_text())
    hf["eos_token_id"] = None
    (bare / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="end-of-sequence"):
        emulated_config(_spec(bare))


def test_preemptible_instances_run_at_their_own_speed(checkpoint):
    base = EmulatedEngineConfig(decode_tokens_per_s=3000.0, sample_tokens_per_s=60.0, prefill_tokens_per_s=9000.0)
    reserved = emulated_config(_spec(checkpoint, "reserved", 0.5, base))
    spot = emulated_config(_spec(checkpoint, "preemptible", 0.5, base))
    assert (reserved.decode_tokens_per_s, reserved.sample_tokens_per_s) == (3000.0, 60.0)
    assert (spot.decode_tokens_per_s, spot.sample_tokens_per_s, spot.prefill_tokens_per_s) == (1500.0, 30.0, 4500.0)
    assert spot.stop_probability == base.stop_probability
    derived = emulated_config(_spec(checkpoint, "preemptible", 0.5, EmulatedEngineConfig(decode_tokens_per_s=6400.0)))
    assert derived.sample_tokens_per_s is None and derived.per_sample_tokens_per_s == 3200.0 / derived.max_running


def test_spec_refuses_two_engines_and_a_bad_speed(checkpoint):
    with pytest.raises(ValueError, match="at most one"):
        InstanceSpec(instance_id="spot-0", kind="preemptible", capacity=8,
                     engine=EmbeddedEngineConfig(model_dir=str(checkpoint)), transfer=TransferConfig(),
                     sources=("127.0.0.1:1",), sglang=SGLangEngineConfig(model_path=str(checkpoint)),
                     emulated=EmulatedEngineConfig())
    with pytest.raises(ValueError, match="emulated_preemptible_speed"):
        _spec(checkpoint, speed=0.0)
