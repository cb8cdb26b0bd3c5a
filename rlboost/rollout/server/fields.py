"""Checks shared by the configs of the server engines (SGLang, vLLM): both launch an
inference server on tp_size GPUs from a checkpoint, stream tokens, load weights in buckets
and take extra server arguments, except the ones their adapter sets itself."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

SERVER_DTYPES = ("auto", "float16", "bfloat16", "float32")


@dataclass(kw_only=True, slots=True)
class ServerEngineFields:
    """The fields every server engine's config has; each engine adds its memory share and
    its own switches, and validates with check_server_fields."""

    model_path: str | None = None
    """checkpoint the server loads at start (set by the run: the weights it trains)"""
    tp_size: int = 1
    """GPUs one engine spans (tensor parallel); rollout.instance_gpus must cover it"""
    dtype: str = "auto"
    """the server's dtype (auto: the checkpoint's)"""
    stream_interval: int = 8
    """tokens per streamed chunk (a lost instance loses at most this many per sample)"""
    max_model_len: int | None = None
    """longest prompt + output (None: the model's maximum)"""
    vocab_size: int | None = None
    """vocabulary (None: config.json's)"""
    weight_version: int = 0
    """version of the weights in model_path (set by the run)"""
    weight_bucket_bytes: int = 512 << 20
    """bytes of weights handed to the server per update call"""
    rate_window_s: float = 10.0
    """decode tokens/s is measured over this much recent busy time"""
    flush_timeout_s: float = 60.0
    """how long a weight load waits for the server to go idle and drop its prefix cache"""
    extra_engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """more server arguments, as JSON on the command line"""


def check_server_fields(config: Any, *, memory_field: str, managed: tuple[str, ...], kwargs_kind: str) -> None:
    """ValueError naming the field unless every shared field of a server engine's config
    is valid. memory_field: the share-of-GPU-memory field's name; managed: the server
    arguments the adapter sets (extra_engine_kwargs may not); kwargs_kind: what the extra
    arguments' keys are called in the server's own docs (for the message)."""
    if config.model_path is not None and (not isinstance(config.model_path, str) or not config.model_path):
        raise ValueError(f"model_path must be a non-empty path or None, got {config.model_path!r}")
    for name, low in (("tp_size", 1), ("stream_interval", 1), ("weight_bucket_bytes", 1 << 20),
                      ("weight_version", 0)):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    share = getattr(config, memory_field)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
        raise ValueError(f"{memory_field} must be in (0, 1), got {share!r}")
    if config.dtype not in SERVER_DTYPES:
        raise ValueError(f"dtype must be one of {SERVER_DTYPES}, got {config.dtype!r}")
    for name in ("max_model_len", "vocab_size"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 2):
            raise ValueError(f"{name} must be an int >= 2 or None, got {value!r}")
    for name in ("rate_window_s", "flush_timeout_s"):
        value = getattr(config, name)
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    taken = sorted(set(config.extra_engine_kwargs) & set(managed))
    if taken:
        raise ValueError(f"extra_engine_kwargs may not set {taken}: use the config's own fields "
                         f"(the adapter sets {list(managed)})")
    if not all(isinstance(k, str) for k in config.extra_engine_kwargs):
        raise ValueError(f"extra_engine_kwargs keys must be strings ({kwargs_kind} field names)")
