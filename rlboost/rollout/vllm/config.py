"""VLLMEngineConfig: how the vLLM rollout engine is launched, and which engine arguments it
sets itself (the adapter relies on them, so extra kwargs may not override them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlboost.rollout.server_fields import SERVER_DTYPES, ServerEngineFields, check_server_fields

VLLM_DTYPES = SERVER_DTYPES
WORKER_EXTENSION = "rlboost.rollout.vllm.worker.RlboostWorkerExtension"

# Engine arguments the adapter depends on: token ids in and out (no tokenizer), log-probs of
# the sampled distribution (after temperature, as the trainer scores them), the stream
# cadence, and the worker extension that loads weights from shared memory.
MANAGED_ENGINE_KWARGS = ("model", "tensor_parallel_size", "gpu_memory_utilization", "dtype", "stream_interval",
                         "skip_tokenizer_init", "logprobs_mode", "worker_extension_cls", "max_model_len",
                         "enable_prefix_caching")


@dataclass(kw_only=True, slots=True)
class VLLMEngineConfig(ServerEngineFields):
    """Configuration of one VLLMEngine (one vLLM `AsyncLLM` on tp_size GPUs).

    >>> VLLMEngineConfig(model_path="/ckpt/qwen3-1.7b", tp_size=2).engine_kwargs()["tensor_parallel_size"]
    2

    model_path: HF-style checkpoint directory vLLM loads (its config.json and safetensors
    headers also give the vocabulary, the longest sequence, and the names and shapes that
    load_weights checks). stream_interval: tokens vLLM decodes per streamed output (a lost
    instance loses at most this many tokens per sample). seeded: pass each sample a seed
    derived from (seed, sample_id), so sampled tokens follow it (vLLM seeds a generator per
    request: a sample resumed by re-prefill draws anew from its seed).
    """

    gpu_memory_utilization: float = 0.8
    """share of GPU memory vLLM takes for weights and KV cache"""
    seeded: bool = True
    """give each sample its own seed (sampled tokens then follow the sample's seed)"""

    def __post_init__(self) -> None:
        check_server_fields(self, memory_field="gpu_memory_utilization", managed=MANAGED_ENGINE_KWARGS, kwargs_kind="AsyncEngineArgs")

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `vllm.AsyncEngineArgs(...)`."""
        kwargs: dict[str, Any] = {"disable_log_stats": True, **self.extra_engine_kwargs}
        kwargs.update(model=self.model_path, tensor_parallel_size=self.tp_size,
                      gpu_memory_utilization=self.gpu_memory_utilization, dtype=self.dtype,
                      stream_interval=self.stream_interval, skip_tokenizer_init=True,
                      logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
                      enable_prefix_caching=True)
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        return kwargs
