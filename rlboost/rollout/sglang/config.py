"""SGLangEngineConfig: how the SGLang rollout engine is launched, and which SGLang server
arguments it sets itself (the adapter relies on them, so extra kwargs may not override them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlboost.rollout.server.fields import SERVER_DTYPES, ServerEngineFields, check_server_fields

SGLANG_DTYPES = SERVER_DTYPES

# Server arguments the adapter depends on: token ids in and out (no detokenizer), honoured
# per-request seeds, and the stream cadence.
MANAGED_ENGINE_KWARGS = ("model_path", "tp_size", "mem_fraction_static", "dtype", "stream_interval",
                         "skip_tokenizer_init", "enable_deterministic_inference", "context_length")


@dataclass(kw_only=True, slots=True)
class SGLangEngineConfig(ServerEngineFields):
    """Configuration of one SGLangEngine (one `sglang.Engine` on tp_size GPUs).

    >>> SGLangEngineConfig(model_path="/ckpt/qwen3-1.7b", tp_size=2, stream_interval=16).engine_kwargs()["tp_size"]
    2

    model_path: HF-style checkpoint directory SGLang loads (its config.json and safetensors
    headers also give the vocabulary, the longest sequence, and the names and shapes that
    load_weights checks).
    mem_fraction_static: share of GPU memory SGLang takes for weights and KV cache.
    dtype: SGLang's dtype ("auto" keeps the checkpoint's).
    stream_interval: tokens SGLang decodes per streamed chunk (a preempted instance loses at
    most this many tokens per sample).
    deterministic_inference: run SGLang with enable_deterministic_inference, which it needs
    to honour per-request seeds (`sampling_seed`); without it sampled tokens ignore the
    sample's seed. Costs some throughput.
    max_model_len: longest prompt + output admitted (passed to SGLang as context_length);
    default: config.json's max_position_embeddings.
    vocab_size: default: config.json's vocab_size.
    weight_version: version of the weights in model_path.
    weight_bucket_bytes: load_weights hands SGLang the weights in buckets of about this size
    (each bucket is copied once into memory the adapter owns; see load_weights).
    rate_window_s: decode tokens/s is measured over this much recent busy time.
    flush_timeout_s: how long load_weights and release_memory wait for SGLang's scheduler to
    go idle (it refuses to flush its prefix cache, or to release memory, while requests it
    was asked to abort are still draining) before the engine counts as failed.
    extra_engine_kwargs: further `sglang.Engine` (ServerArgs) keyword arguments, e.g.
    {"attention_backend": "flashinfer", "random_seed": 0}.
    """

    mem_fraction_static: float = 0.8
    """share of GPU memory SGLang takes for weights and KV cache"""
    deterministic_inference: bool = True
    """honour per-sample seeds (SGLang's deterministic mode; costs throughput)"""

    def __post_init__(self) -> None:
        check_server_fields(self, memory_field="mem_fraction_static", managed=MANAGED_ENGINE_KWARGS, kwargs_kind="ServerArgs")

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `sglang.Engine(...)`."""
        kwargs: dict[str, Any] = {"log_level": "error", **self.extra_engine_kwargs}
        kwargs.update(model_path=self.model_path, tp_size=self.tp_size,
                      mem_fraction_static=self.mem_fraction_static, dtype=self.dtype,
                      stream_interval=self.stream_interval, skip_tokenizer_init=True,
                      enable_deterministic_inference=self.deterministic_inference)
        if self.max_model_len is not None:
            kwargs["context_length"] = self.max_model_len
        return kwargs
