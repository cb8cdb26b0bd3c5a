"""Any Hugging Face transformers causal LM as the trainer's model (model.impl=transformers):
loaded from a checkpoint directory, its decoder blocks at model.model.layers for FSDP2, its
layers checkpointed through transformers' own switch, saved back with save_pretrained.

Also the few facts of any checkpoint's config.json that the run needs without building a
model (its architecture, vocabulary, end tokens), for architectures rlboost's decoders
do not cover.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlboost import env
from rlboost.models.config import ARCHITECTURES


def read_hf_config(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's config.json as a dict (FileNotFoundError / ValueError naming it)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {directory}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None


def architecture(hf: dict[str, Any]) -> str:
    """The checkpoint's class name as transformers knows it (e.g. MistralForCausalLM)."""
    names = hf.get("architectures") or []
    return str(names[0]) if names else str(hf.get("model_type", "unknown"))


def served_by_rlboost(hf: dict[str, Any]) -> bool:
    """Whether rlboost's own decoders (and so the embedded engine) cover this checkpoint."""
    return hf.get("model_type") in ARCHITECTURES


def embedded_refusal(directory: str | Path, hf: dict[str, Any]) -> str:
    """The one line that turns an architecture away from the embedded engine."""
    return (f"rollout.backend=embedded serves Llama, Qwen2 and Qwen3 checkpoints only (rlboost's batch-invariant "
            f"decoders); {directory} is {architecture(hf)}: roll it out with SGLang (--set rollout.backend=sglang) "
            f"and train it with --set model.impl=transformers")


def eos_token_ids(hf: dict[str, Any]) -> tuple[int, ...]:
    value = hf.get("eos_token_id")
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


def _attention(device: torch.device | str) -> str:
    """flash-attention 2 on a GPU where it is installed (packs through position ids with no
    padding), torch's SDPA otherwise."""
    import importlib.util

    on_gpu = torch.device(device).type == "cuda"
    return "flash_attention_2" if on_gpu and importlib.util.find_spec("flash_attn") else "sdpa"


def load_causal_lm(directory: str | Path, *, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> nn.Module:
    """A transformers causal LM with the checkpoint's weights, in dtype on device."""
    env.apply_hf_defaults()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, attn_implementation=_attention(device))
    if getattr(getattr(model, "model", None), "layers", None) is None:
        raise ValueError(f"{directory}: {type(model).__name__} has no model.layers (decoder blocks) to shard")
    return model.to(device)


def checkpoint_layers(model: nn.Module) -> None:
    """Recompute each decoder layer in backward (transformers' gradient checkpointing, which
    applies in training mode only; these configs' dropout is what the checkpoint says)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()


def empty_causal_lm(config: Any) -> nn.Module:
    """A model of the same class and config with uninitialised CPU parameters (a shell for
    gathered weights)."""
    env.apply_hf_defaults()
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(config)
    shell.to_empty(device="cpu")
    shell.tie_weights()  # to_empty re-creates parameters, which unties a tied head
    return shell.requires_grad_(False)


def save_causal_lm(model: nn.Module, directory: str | Path) -> Path:
    """config.json and safetensors, as transformers writes them."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    return Path(directory)
