"""Recipes build valid RunConfigs; every section refuses bad values by name; a config
survives the trip through config.json (what --resume reads back)."""

from __future__ import annotations

import json

import pytest

from rlboost.config.overrides import apply_overrides, from_dict, to_dict
from rlboost.config.run import RunConfig, parse_injection
from rlboost.recipes import DEFAULT_RECIPE, get_recipe, recipes


@pytest.fixture
def secret(monkeypatch):
    """qwen3_gpu's servers listen on every interface: it needs a shared secret."""
    monkeypatch.setenv("RLBOOST_SECRET", "recipe-test-secret")


@pytest.mark.parametrize("name", sorted(recipes()))
def test_each_recipe_is_a_valid_config_that_round_trips_through_json(name, secret):
    config = get_recipe(name)
    assert isinstance(config, RunConfig)
    back = from_dict(RunConfig, json.loads(json.dumps(to_dict(config))))
    assert back == config


def test_default_recipe_shape():
    config = get_recipe(DEFAULT_RECIPE)
    assert DEFAULT_RECIPE == "tiny_cpu"
    assert config.model.source == "tiny" and config.model.warmup_steps > 0
    assert config.trainer.world_size == 2 and config.cluster.reserved_instances == 1
    assert 2 <= config.cluster.max_preemptible <= 3 and config.cluster.trace == "sample"
    assert 0 < config.cluster.sudden_fraction < 1  # both kinds of preemption


def test_gpu_recipe_runs_nccl_on_cuda(secret):
    config = get_recipe("qwen3_gpu")
    assert config.trainer.device == "cuda" and config.trainer.backend == "nccl"
    assert config.rollout.backend == "sglang" and config.rollout.instance_gpus >= config.rollout.sglang.tp_size
    assert config.rollout.embedded.device == "cuda"  # for --set rollout.backend=embedded
    assert config.transfer.bind_host == "0.0.0.0" and config.transfer.secret == b"recipe-test-secret"
    # it can join a multi-node cluster as it is
    assert apply_overrides(config, ["cluster.address=10.0.0.1:6379"]).cluster.address == "10.0.0.1:6379"


def test_gpu_recipe_builds_without_a_secret_but_serves_only_with_the_runs(monkeypatch):
    monkeypatch.delenv("RLBOOST_SECRET", raising=False)
    config = get_recipe("qwen3_gpu")  # the run draws its secret and hands it to its processes
    assert config.transfer.secret is None
    with pytest.raises(ValueError, match="secret"):
        config.transfer.require_secret()  # no server listens on every interface without one


def test_unknown_recipe_names_the_known_ones():
    with pytest.raises(ValueError, match="tiny_cpu"):
        get_recipe("nope")


@pytest.mark.parametrize("assignment, field", [
    ("trainer.world_size=0", "trainer.world_size"),
    ("task.group_size=1", "task.group_size"),
    ("task.temperature=0", "task.temperature"),
    ("cluster.sudden_fraction=1.5", "cluster.sudden_fraction"),
    ("cluster.initial_preemptible=9", "cluster.initial_preemptible"),
    ("cluster.inject=later@2", "cluster.inject"),
    ("cluster.inject=kill@61", "cluster.inject"),  # tiny_cpu runs 60 steps
    ("model.source=hub", "model.source"),
    ("rollout.capacity=999", "rollout.capacity"),
    ("controller.max_staleness=9", "max_staleness"),
    ("controller.registry.max_staleness=-1", "max_staleness"),
    ("run.name=a/b", "run.name"),
])
def test_bad_values_are_refused_naming_the_field(assignment, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        apply_overrides(get_recipe("tiny_cpu"), [assignment])


def test_overrides_reach_nested_sections():
    config = apply_overrides(get_recipe("tiny_cpu"), [
        "task.arithmetic.max_operand=19", "cluster.inject=notice@2,kill@3", "trainer.max_grad_norm=none",
        "rollout.engine.num_blocks=64"])
    assert config.task.arithmetic.max_operand == 19
    assert config.cluster.inject == ("notice@2", "kill@3")
    assert config.trainer.optimizer.max_grad_norm is None and config.rollout.embedded.num_blocks == 64


def test_the_staleness_bound_is_one_setting_and_its_old_path_reaches_it():
    assert apply_overrides(get_recipe("tiny_cpu"), ["controller.max_staleness=1"]).controller.max_staleness == 1
    assert apply_overrides(get_recipe("tiny_cpu"),
                           ["controller.registry.max_staleness=2"]).controller.max_staleness == 2


def test_secrets_never_reach_config_json():
    config = apply_overrides(get_recipe("tiny_cpu"), [])
    config.transfer.secret = b"hunter2"
    text = json.dumps(to_dict(config))
    assert "hunter2" not in text and json.loads(text)["transfer"]["secret"] is None


def test_from_dict_refuses_unknown_fields():
    data = to_dict(get_recipe("tiny_cpu"))
    data["trainer"]["learning_rate"] = 1.0
    with pytest.raises(ValueError, match="learning_rate"):
        from_dict(RunConfig, data)


def test_parse_injection():
    assert parse_injection("notice@2") == ("notice", 2)
    assert parse_injection("kill@10") == ("kill", 10)
    for bad in ("notice", "kill@0", "kill@x", "stop@3"):
        with pytest.raises(ValueError, match="cluster.inject"):
            parse_injection(bad)
