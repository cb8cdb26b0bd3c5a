"""VLLMEngineConfig: how the vLLM rollout engine is launched, and which engine arguments it
sets itself (the adapter relies on them, so extra kwargs may not override them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from rlboost.rollout.server_fields import SERVER_DTYPES, check_server_fields

VLLM_DTYPES = SERVER_DTYPES
WORKER_EXTENSION = "rlboost.rollout.vllm.worker.RlboostWorkerExtension"

# Engine arguments the adapter depends on: token ids in and out (no tokenizer), log-probs of
# the sampled distribution (after temperature, as the trainer scores them), the stream
# cadence, and the worker extension that loads weights from shared memory.
MANAGED_ENGINE_KWARGS = ("model", "tensor_parallel_size", "gpu_memory_utilization", "dtype", "stream_interval",
                         "skip_tokenizer_init", "logprobs_mode", "worker_extension_cls", "max_model_len",
                         "enable_prefix_caching")


@dataclass(kw_only=True, slots=True)
class VLLMEngineConfig:
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

    model_path: str | None = None
    """checkpoint vLLM loads at start (set by the run: the weights it trains)"""
    tp_size: int = 1
    """GPUs one vLLM engine spans (tensor parallel); rollout.instance_gpus must cover it"""
    gpu_memory_utilization: float = 0.8
    """share of GPU memory vLLM takes for weights and KV cache"""
    dtype: str = "auto"
    """vLLM's dtype (auto: the checkpoint's)"""
    stream_interval: int = 8
    """tokens per streamed output (a lost instance loses at most this many per sample)"""
    seeded: bool = True
    """give each sample its own seed (sampled tokens then follow the sample's seed)"""
    max_model_len: int | None = None
    """longest prompt + output (None: the model's maximum)"""
    vocab_size: int | None = None
    """vocabulary (None: config.json's)"""
    weight_version: int = 0
    """version of the weights in model_path (set by the run)"""
    weight_bucket_bytes: int = 512 << 20
    """bytes of weights handed to vLLM's workers per call (one shared-memory file each)"""
    rate_window_s: float = 10.0
    """decode tokens/s is measured over this much recent busy time"""
    flush_timeout_s: float = 60.0
    """how long a weight load waits for vLLM to drop its prefix cache (it refuses while requests run)"""
    extra_engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """more vllm AsyncEngineArgs arguments, as JSON on the command line"""

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
