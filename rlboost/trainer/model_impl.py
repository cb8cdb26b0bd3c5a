"""The trainer's model by model.impl: rlboost's own decoders (Llama, Qwen2, Qwen3) or any
transformers causal LM. Both load an HF checkpoint directory, recompute their decoder
layers in backward when asked, and give a CPU shell that the gathered weights fill to be
saved as a checkpoint directory again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlboost.models import empty_model, hf, load_pretrained, save_pretrained

IMPLS = ("rlboost", "transformers")


class RlboostModels:
    """rlboost's batch-invariant decoders (DecoderLM), the embedded engine's own."""

    def load(self, path: str, device: torch.device) -> nn.Module:
        return load_pretrained(path, device=device)

    def checkpoint_layers(self, model: nn.Module) -> None:
        model.activation_checkpointing = True

    def shell(self, config: Any) -> nn.Module:
        return empty_model(config).requires_grad_(False)

    def save(self, shell: nn.Module, directory: Path) -> None:
        save_pretrained(shell, directory)


class TransformersModels:
    """Any transformers causal LM whose decoder blocks sit at model.model.layers."""

    def load(self, path: str, device: torch.device) -> nn.Module:
        return hf.load_causal_lm(path, device=device)

    def checkpoint_layers(self, model: nn.Module) -> None:
        hf.checkpoint_layers(model)

    def shell(self, config: Any) -> nn.Module:
        return hf.empty_causal_lm(config)

    def save(self, shell: nn.Module, directory: Path) -> None:
        hf.save_causal_lm(shell, directory)


def model_impl(name: str) -> RlboostModels | TransformersModels:
    if name not in IMPLS:
        raise ValueError(f"model.impl must be one of {IMPLS}, got {name!r}")
    return RlboostModels() if name == "rlboost" else TransformersModels()
