"""rollout.backend=vllm: the config that selects it (qwen3_gpu included), and the factory that
builds the engine (against the stand-in here; without vLLM, one line that names the extra)."""

from __future__ import annotations

import importlib.util

import pytest
from fake_vllm import FAKES

from rlboost.config.overrides import apply_overrides
from rlboost.recipes import get_recipe
from rlboost.rollout import factory
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.vllm import engine as vllm_engine
from rlboost.rollout.vllm.config import VLLMEngineConfig


def test_qwen3_gpu_selects_vllm_with_the_same_shape(monkeypatch):
    monkeypatch.setenv("RLBOOST_SECRET", "recipe-test-secret")
    config = apply_overrides(get_recipe("qwen3_gpu"), ["rollout.backend=vllm"])
    rollout = config.rollout
    assert rollout.engine is rollout.vllm and rollout.vllm.tp_size == 2 <= rollout.instance_gpus
    assert rollout.on_gpu and rollout.weights_dtype == "bfloat16"


def test_an_instance_needs_the_gpus_of_its_engine():
    with pytest.raises(ValueError, match=r"instance_gpus must be >= vllm.tp_size \(2\)"):
        RolloutConfig(backend="vllm", instance_gpus=1, vllm=VLLMEngineConfig(tp_size=2))
    with pytest.raises(ValueError, match="extra_engine_kwargs may not set .'worker_extension_cls'."):
        VLLMEngineConfig(extra_engine_kwargs={"worker_extension_cls": "x.Y"})


def test_the_factory_builds_a_vllm_engine_without_weights_of_its_own(tiny_ckpt, monkeypatch):
    fake = FAKES["0.27"]
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: vllm_engine.VLLMApi(**vars(fake)))
    engine = factory.build_engine(RolloutConfig(backend="vllm", instance_gpus=1), model_dir=str(tiny_ckpt))
    try:
        assert isinstance(engine, vllm_engine.VLLMEngine) and engine.load().weight_version == 0
    finally:
        engine.close()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_engine_says_which_extra_to_install(tiny_ckpt):
    with pytest.raises(ImportError, match=r"pip install 'rlboost\[vllm\]'"):
        factory.build_engine(RolloutConfig(backend="vllm", instance_gpus=1), model_dir=str(tiny_ckpt))
