"""VLLMEngineConfig: how the vLLM rollout engine is launched, and which engine arguments it
sets itself (the adapter relies on them, so extra kwargs may not override them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

VLLM_DTYPES = ("auto", "float16", "bfloat16", "float32")
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
        if self.model_path is not None and (not isinstance(self.model_path, str) or not self.model_path):
            raise ValueError(f"model_path must be a non-empty path or None, got {self.model_path!r}")
        for name, low in (("tp_size", 1), ("stream_interval", 1), ("weight_bucket_bytes", 1 << 20),
                          ("weight_version", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not 0.0 < self.gpu_memory_utilization < 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1), got {self.gpu_memory_utilization}")
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"dtype must be one of {VLLM_DTYPES}, got {self.dtype!r}")
        for name in ("max_model_len", "vocab_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 2):
                raise ValueError(f"{name} must be an int >= 2 or None, got {value!r}")
        for name in ("rate_window_s", "flush_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0
                                               and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        taken = sorted(set(self.extra_engine_kwargs) & set(MANAGED_ENGINE_KWARGS))
        if taken:
            raise ValueError(f"extra_engine_kwargs may not set {taken}: use the config's own fields "
                             f"(the adapter sets {list(MANAGED_ENGINE_KWARGS)})")
        if not all(isinstance(k, str) for k in self.extra_engine_kwargs):
            raise ValueError("extra_engine_kwargs keys must be strings (AsyncEngineArgs field names)")

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
