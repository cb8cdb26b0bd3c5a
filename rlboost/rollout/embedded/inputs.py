"""Checks on what enters the embedded engine (imported batches, weight sets), so bad input
is refused whole with a RolloutError before anything changes. Submitted states are checked
by rollout.admission, shared with the other engines.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from rlboost.errors import RolloutError
from rlboost.migration.layout import KVLayout
from rlboost.models.checkpoint import match_weight_names
from rlboost.models.decoder import DecoderLM


def check_import(batch, layout: KVLayout) -> list:
    """Per state: None (re-prefill) or (kv_tokens, page bytes) to place in the cache."""
    from rlboost.migration.batch import MigrationBatch

    if not isinstance(batch, MigrationBatch):
        raise RolloutError(f"expected MigrationBatch, got {type(batch).__name__}")
    n = len(batch.states)
    if batch.kv_layout is None:
        return [None] * n
    if not batch.kv_layout.compatible_with(layout):
        raise RolloutError(f"KV pages in layout {batch.kv_layout} cannot be used here: this engine "
                           f"needs num_layers, num_kv_heads, head_dim and dtype of {layout}")
    if len(batch.kv_tokens or ()) != n or len(batch.kv_data or ()) != n:
        raise RolloutError(f"batch has {n} states but {len(batch.kv_tokens or ())} kv_tokens and "
                           f"{len(batch.kv_data or ())} kv_data entries")
    pages = []
    for state, tokens, data in zip(batch.states, batch.kv_tokens, batch.kv_data):
        if not 0 <= tokens <= state.position:
            raise RolloutError(f"sample {state.sample_id}: kv_tokens {tokens} outside "
                               f"[0, {state.position}]")
        expected = tokens * layout.token_bytes
        if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != expected:
            raise RolloutError(f"sample {state.sample_id}: KV pages must be {expected} bytes "
                               f"(1-D uint8), got {tuple(data.shape)} {data.dtype}")
        pages.append((tokens, data) if tokens > 0 else None)
    return pages


def _as_tensor(name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise RolloutError(f"weight {name!r} is a {type(value).__name__}, expected a tensor")


def load_named_tensors(model: DecoderLM, named: Mapping[str, object], version: int) -> None:
    """Copy a complete set of HF-named tensors into the model's parameters in place."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise RolloutError(f"version must be a non-negative int, got {version!r}")
    params, names, unknown, missing = match_weight_names(model, named)
    if unknown or missing:
        raise RolloutError(f"weights do not match the model: unknown {unknown[:5]}, missing {missing[:5]}")
    sources = {n: _as_tensor(n, named[n]) for n in names}
    for n, t in sources.items():
        if tuple(t.shape) != tuple(params[n].shape):
            raise RolloutError(f"weight {n!r} has shape {tuple(t.shape)}, expected {tuple(params[n].shape)}")
        if not (t.is_floating_point()):
            raise RolloutError(f"weight {n!r} has dtype {t.dtype}, expected a floating point type")
    with torch.no_grad():
        for n, t in sources.items():
            params[n].copy_(t)
