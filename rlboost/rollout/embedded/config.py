"""EmbeddedEngineConfig: how the embedded torch engine is sized and where it runs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlboost.models.checkpoint import TORCH_DTYPES, dtype_from_name


@dataclass(kw_only=True, slots=True)
class EmbeddedEngineConfig:
    """Configuration of one EmbeddedEngine.

    >>> EmbeddedEngineConfig(model_dir="/ckpt/qwen3-tiny", num_blocks=256, stream_interval=4).block_size
    16

    model_dir: HF-style checkpoint directory (unless a DecoderLM is handed to the engine).
    weight_version: the version number of the weights in model_dir.
    num_blocks x block_size: KV-cache capacity in tokens (shared by all samples).
    max_batch_size: samples decoding at once; max_prefill_tokens: prompt tokens fed per step.
    stream_interval: tokens a sample gathers before its delta is released (and at finish).
    max_model_len: longest prompt + output accepted; must fit num_blocks x block_size
    (default: the model's maximum, or the cache's capacity when smaller).
    rate_window_s: decode tokens/s is measured over the last rate_window_s seconds of
    activity (busy time only, so an idle engine keeps reporting its last rate).
    """

    model_dir: str | None = None
    """checkpoint whose shape the engine takes (set by the run)"""
    device: str = "cpu"
    """torch device of the engine: cpu, cuda, cuda:1, ..."""
    dtype: str = "float32"
    """weights and compute dtype: float32, bfloat16 or float16"""
    num_blocks: int = 1024
    """KV-cache blocks shared by all samples"""
    block_size: int = 16
    """tokens per KV-cache block"""
    max_batch_size: int = 64
    """samples decoding at once"""
    max_prefill_tokens: int = 512
    """prompt tokens prefilled per engine step"""
    stream_interval: int = 8
    """tokens a sample gathers before they are sent (a lost instance loses at most these)"""
    max_model_len: int | None = None
    """longest prompt + output (None: the model's maximum, capped by the cache)"""
    weight_version: int = 0
    """version of the weights in model_dir (set by the run)"""
    rate_window_s: float = 10.0
    """decode tokens/s is measured over this much recent busy time"""

    def __post_init__(self) -> None:
        try:
            torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"device must be a torch device string such as 'cpu' or 'cuda:0', "
                             f"got {self.device!r}") from e
        dtype_from_name(self.dtype)  # ValueError naming the allowed values
        for name, low in (("num_blocks", 1), ("block_size", 1), ("max_batch_size", 1),
                          ("max_prefill_tokens", 1), ("stream_interval", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 or None, got {self.max_model_len}")
        if self.weight_version < 0:
            raise ValueError(f"weight_version must be >= 0, got {self.weight_version}")
        if not (self.rate_window_s > 0 and math.isfinite(self.rate_window_s)):
            raise ValueError(f"rate_window_s must be a positive number, got {self.rate_window_s}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]
