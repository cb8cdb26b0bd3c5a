"""The trainer's memory plan: qwen3_gpu (Qwen3-8B, responses up to 14,336 tokens, 4 ranks)
fits an H100 with activation checkpointing and optimizer offload, does not without them,
and its launch is then refused in one line naming the largest term and the setting that
shrinks it, before any GPU is looked for."""

from __future__ import annotations

import dataclasses

import pytest

from rlboost.cli import main
from rlboost.config.overrides import apply_overrides
from rlboost.errors import ConfigError
from rlboost.recipes import get_recipe
from rlboost.run.job import preflight
from rlboost.run.plan import run_memory_plan
from rlboost.trainer.memory import KNOWN_MODELS, ModelDims


def _config(*sets: str):
    return apply_overrides(get_recipe("qwen3_gpu"), list(sets))


def test_qwen3_gpu_fits_an_h100():
    plan = run_memory_plan(_config())
    assert plan.device == "h100-sxm" and plan.capacity_bytes == 80e9
    assert plan.fits and plan.total_bytes < 0.5 * plan.capacity_bytes


@pytest.mark.parametrize("sets", [("trainer.activation_checkpointing=false",),
                                  ("trainer.activation_checkpointing=false", "trainer.optimizer.offload=false")])
def test_without_checkpointing_it_does_not_fit_and_launch_is_refused(sets):
    config = _config(*sets)
    plan = run_memory_plan(config)
    assert not plan.fits and plan.largest.name.startswith("activations")
    with pytest.raises(ConfigError) as err:
        preflight(config)  # refused on the plan, before the machine's GPUs are counted
    line = str(err.value)
    assert "\n" not in line and "activations" in line and "trainer.activation_checkpointing=true" in line


def test_without_offload_the_optimizer_terms_come_back():
    with_offload, without = run_memory_plan(_config()), run_memory_plan(_config("trainer.optimizer.offload=false"))
    terms = {t.name: t.nbytes for t in without.terms}
    assert terms["optimizer state"] == pytest.approx(2 * 4 * KNOWN_MODELS["qwen3-8b"].params / 4)
    assert without.total_bytes > with_offload.total_bytes


def test_plan_command_prints_a_table(capsys):
    assert main(["plan", "--recipe", "qwen3_gpu"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-8b" in out.lower() and "activations" in out and "fits" in out
    assert main(["plan", "--recipe", "qwen3_gpu", "--set", "trainer.activation_checkpointing=false"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_dims_from_a_config_json_count_qwen3_8b_parameters():
    hf = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
          "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
          "tie_word_embeddings": False}
    dims = ModelDims.from_hf_config(hf, name="qwen3-8b")
    assert dataclasses.replace(dims, name="qwen3-8b") == KNOWN_MODELS["qwen3-8b"]
    assert 8.1e9 < dims.params < 8.3e9  # the model card's 8.2B
