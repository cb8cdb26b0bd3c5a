"""Checks shared by the configs of the server engines (SGLang, vLLM): both launch an
inference server on tp_size GPUs from a checkpoint, stream tokens, load weights in buckets
and take extra server arguments, except the ones their adapter sets itself."""

from __future__ import annotations

import math
from typing import Any

SERVER_DTYPES = ("auto", "float16", "bfloat16", "float32")


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
