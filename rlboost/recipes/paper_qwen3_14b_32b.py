"""paper_qwen3_14b and paper_qwen3_32b: the RLBoost paper's two larger models in its setup
(paper_qwen3_8b's, emulated at the same proportions): 128 prompts x 8 samples, responses up to
14,336 tokens, preemptible instances of 2x H100 (TP 2) at a quarter of an 8x H100 spot node.

- Qwen3-14B: one reserved 8x H100 node rolling out as four TP-2 engines; the published rule
  starts from the windows its source holds for a 14B model (PolyRL balance.rs, commented out
  there: {1: 346, 2: 212, 3: 145, 4: 60, 5: 8, 6: 5} s).
- Qwen3-32B: two reserved 8x H100 nodes (as the paper trains it). Colocated TP-2 engines would
  keep 6 GB of KV cache each beside the trainer's resident state (32.8B parameters x 6 bytes
  over 16 GPUs), so the reserved nodes roll out as four TP-4 engines (77 GB of KV each); the
  published rule has no windows for it and starts from 150 s.
"""

from __future__ import annotations

from rlboost.config.run import RunConfig
from rlboost.recipes.paper_qwen3_8b import PaperModel, paper_recipe

REFERENCE_14B_OPTIMA = ((1, 346.0), (2, 212.0), (3, 145.0), (4, 60.0), (5, 8.0), (6, 5.0))

QWEN3_14B = PaperModel("paper_qwen3_14b", "qwen3-14b", seeded_optima=REFERENCE_14B_OPTIMA)
QWEN3_32B = PaperModel("paper_qwen3_32b", "qwen3-32b", trainer_nodes=2, reserved_engine_gpus=4)


def paper_qwen3_14b() -> RunConfig:
    return paper_recipe(QWEN3_14B)


def paper_qwen3_32b() -> RunConfig:
    return paper_recipe(QWEN3_32B)
