"""rollout.backend=emulated in a run config: its engine speeds are set with --set like any
field, bad ones are refused naming the field, and the config survives config.json."""

from __future__ import annotations

import json

import pytest

from rlboost.config.overrides import apply_overrides, from_dict, to_dict
from rlboost.config.run import RunConfig
from rlboost.recipes import get_recipe
from rlboost.run.launch import instance_template

EMULATED = ["rollout.backend=emulated", "rollout.emulated.decode_tokens_per_s=3000",
            "rollout.emulated.sample_tokens_per_s=75", "rollout.emulated_preemptible_speed=0.5"]  # an old path: rollout.emulated.preemptible_speed


def test_emulated_speeds_are_set_like_any_field_and_round_trip():
    config = apply_overrides(get_recipe("tiny_cpu"), EMULATED)
    r = config.rollout
    assert r.backend == "emulated" and r.emulated.decode_tokens_per_s == 3000.0
    assert r.emulated.sample_tokens_per_s == 75.0 and r.emulated.preemptible_speed == 0.5
    assert from_dict(RunConfig, json.loads(json.dumps(to_dict(config)))) == config


def test_instances_get_the_emulated_engine_only_with_that_backend(tmp_path):
    emulated = instance_template(apply_overrides(get_recipe("tiny_cpu"), EMULATED), tmp_path, "127.0.0.1:1")
    assert emulated.rollout.backend == "emulated" and emulated.rollout.engine.decode_tokens_per_s == 3000.0
    assert emulated.rollout.engine.preemptible_speed == 0.5
    embedded = instance_template(get_recipe("tiny_cpu"), tmp_path, "127.0.0.1:1")
    assert embedded.rollout.backend == "embedded" and embedded.model_dir == str(tmp_path)


@pytest.mark.parametrize("assignment, field", [
    ("rollout.emulated.decode_tokens_per_s=0", "rollout.emulated.decode_tokens_per_s"),
    ("rollout.emulated.sample_tokens_per_s=-1", "rollout.emulated.sample_tokens_per_s"),
    ("rollout.emulated.stop_probability=1.5", "rollout.emulated.stop_probability"),
    ("rollout.emulated.max_running=0", "rollout.emulated.max_running"),
    ("rollout.emulated_preemptible_speed=0", "rollout.emulated.preemptible_speed"),
    ("rollout.backend=tpu", "rollout.backend"),
])
def test_bad_emulated_settings_are_refused_naming_the_field(assignment, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.").rsplit(".", 1)[-1]):
        apply_overrides(get_recipe("tiny_cpu"), ["rollout.backend=emulated", assignment])


def test_capacity_is_checked_against_the_engine_in_use():
    # emulated engines hold rollout.emulated.max_running samples, not embedded.max_batch_size
    config = apply_overrides(get_recipe("tiny_cpu"), ["rollout.backend=emulated",
                                                      "rollout.emulated.max_running=256", "rollout.capacity=128"])
    assert config.rollout.capacity == 128
    with pytest.raises(ValueError, match=r"emulated\.max_running"):
        apply_overrides(config, ["rollout.capacity=512"])
    with pytest.raises(ValueError, match=r"embedded\.max_batch_size"):
        apply_overrides(config, ["rollout.backend=embedded"])


def test_emulated_engines_run_beside_a_gpu_trainer_without_a_gpu_engine():
    config = apply_overrides(get_recipe("tiny_cpu"), ["rollout.backend=emulated", "trainer.rank_gpus=1",
                                                      "trainer.device=cuda"])
    assert config.rollout.embedded.device == "cpu"  # not used: the emulated engine computes nothing
    with pytest.raises(ValueError, match=r"rollout\.embedded\.device"):
        apply_overrides(config, ["rollout.backend=embedded"])
