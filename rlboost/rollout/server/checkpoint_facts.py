"""What an adapter of an engine that loads its checkpoint itself (SGLang, vLLM) knows of
that checkpoint: vocabulary, longest sequence, tensor names and shapes, read from
config.json and safetensors headers without loading a tensor; and how a weight set is
checked against it before the engine sees any of it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from safetensors import safe_open

from rlboost.errors import RolloutError
from rlboost.models.checkpoint import checkpoint_files

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    """vocab_size / max_position_embeddings / head_dim from config.json (None when absent);
    shapes of the tensors load_weights must replace (None when model_path holds no
    safetensors, then only the tensors themselves are checked); tied: the lm_head is the
    embedding."""

    vocab_size: int | None
    max_position_embeddings: int | None
    shapes: dict[str, tuple[int, ...]] | None
    tied: bool
    head_dim: int | None = None


def read_checkpoint_facts(model_path: str) -> CheckpointFacts:
    root = Path(model_path)
    hf: dict = {}
    if (root / "config.json").is_file():
        hf = json.loads((root / "config.json").read_text())
    text = hf.get("text_config") or {}  # multimodal configs nest the decoder's
    vocab = hf.get("vocab_size", text.get("vocab_size"))
    longest = hf.get("max_position_embeddings", text.get("max_position_embeddings"))
    tied = bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    head_dim = _head_dim({**text, **hf})
    shapes = None
    if root.is_dir():
        try:
            files = checkpoint_files(root)
        except FileNotFoundError:
            files = {}
        if files:
            shapes = {}
            for fname, names in files.items():
                with safe_open(root / fname, framework="pt") as f:
                    shapes.update({n: tuple(f.get_slice(n).get_shape()) for n in names if _kept(n, tied)})
    return CheckpointFacts(vocab_size=None if vocab is None else int(vocab),
                           max_position_embeddings=None if longest is None else int(longest),
                           shapes=shapes, tied=tied, head_dim=head_dim)


def _head_dim(hf: dict) -> int | None:
    if hf.get("head_dim"):
        return int(hf["head_dim"])
    if hf.get("hidden_size") and hf.get("num_attention_heads"):
        return int(hf["hidden_size"]) // int(hf["num_attention_heads"])
    return None


def _kept(name: str, tied: bool) -> bool:
    """Names every loader skips: stored rotary buffers, and the lm_head copy of a tied head."""
    return not name.endswith(_IGNORED_SUFFIXES) and not (tied and name == "lm_head.weight")


def check_weights(facts: CheckpointFacts, named: Mapping[str, object]) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs to send, or RolloutError naming what does not fit the model."""
    if not isinstance(named, Mapping):
        raise RolloutError(f"weights must be a mapping of HF names to tensors, got {type(named).__name__}")
    pairs = []
    for name, value in named.items():
        if not _kept(name, facts.tied):
            continue
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise RolloutError(f"weight {name!r} must be a floating point tensor, got "
                               f"{getattr(value, 'dtype', type(value).__name__)}")
        pairs.append((name, value))
    if facts.shapes is not None:
        names = {n for n, _ in pairs}
        unknown, missing = sorted(names - set(facts.shapes)), sorted(set(facts.shapes) - names)
        if unknown or missing:
            raise RolloutError(f"weights do not match the model: unknown {unknown[:5]}, missing {missing[:5]}")
        for name, t in pairs:
            if tuple(t.shape) != facts.shapes[name]:
                raise RolloutError(f"weight {name!r} has shape {tuple(t.shape)}, expected {facts.shapes[name]}")
    if not pairs:
        raise RolloutError("no weights given")
    return pairs
