"""The RLBoost paper's figures as simulations: the published numbers (stated in the NSDI'26
text, arXiv 2510.19225 v3; its figures are images) and the runs that reproduce each one, with
the published mechanisms (reference mode) or rlboost's.

A run is a RunConfig and the simulator's what-ifs of the paper's ablations (SimSpec's seeding,
migration, window_memory, preempt). Nothing here is tuned toward the published numbers: every
run is a paper recipe with the figure's setup changed, and the bench sets the prediction beside
the figure (bench/paper_figures.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from rlboost.config.run import RunConfig
from rlboost.recipes.paper_qwen3_8b import (
    ENGINE_GPUS,
    NODE_GPUS,
    ON_DEMAND_NODE_USD_H,
    SPOT_NODE_USD_H,
    TIME_SCALE,
    TOKEN_BLOCK,
    artifact_setup,
    paper_qwen3_8b,
    with_reference_mechanisms,
)
from rlboost.recipes.paper_qwen3_14b_32b import paper_qwen3_14b, paper_qwen3_32b

MODELS: dict[str, Callable[[], RunConfig]] = {"8b": paper_qwen3_8b, "14b": paper_qwen3_14b, "32b": paper_qwen3_32b}
# reference: the published mechanisms; artifact: them on standalone workers at 0.6 of their
# memory, as the artifact ran (paper_qwen3_8b.artifact_setup); rlboost: rlboost's own
MECHANISMS = ("reference", "artifact", "rlboost")

# The paper's figures (text of arXiv 2510.19225 v3; ../reference/paper-and-gpu-figures.md):
# name -> (figure, what, value). Ratios are over veRL (reserved only) unless said otherwise.
PUBLISHED = {
    "fig10_8b_throughput": ("Fig. 10(a)", "Qwen3-8B on a trace: throughput over veRL", 1.66),
    "fig10_14b_throughput": ("Fig. 10(b)", "Qwen3-14B on a trace: throughput over veRL", 1.97),
    "fig10_32b_throughput": ("Fig. 10(c)", "Qwen3-32B on a trace: throughput over veRL", 1.51),
    "fig10_8b_tokens_per_usd": ("Fig. 10(d)", "Qwen3-8B on a trace: tokens per $ over veRL", 1.34),
    "fig10_14b_tokens_per_usd": ("Fig. 10(d)", "Qwen3-14B on a trace: tokens per $ over veRL", 1.49),
    "fig10_32b_tokens_per_usd": ("Fig. 10(d)", "Qwen3-32B on a trace: tokens per $ over veRL", 1.28),
    "fig11_1_throughput": ("Fig. 11", "14B, 1 instance: throughput over reserved only", 1.37),
    "fig11_1_tokens_per_usd": ("Fig. 11", "14B, 1 instance: tokens per $ (1 / 0.78 cost per token)", 1 / 0.78),
    "fig11_6_throughput": ("Fig. 11", "14B, 6 instances: throughput (1.37 x 1.64)", 1.37 * 1.64),
    "fig11_6_tokens_per_usd": ("Fig. 11", "14B, 6 instances: tokens per $ (1 / (0.78 x 0.79))", 1 / (0.78 * 0.79)),
    "fig12_no_seeding": ("Fig. 12", "14B, 5 of 6 preempted: throughput without seeding / with", 0.81),
    "fig12_no_memory": ("Fig. 12", "14B, 5 of 6 preempted: throughput without memory / with (1 / 1.06)", 1 / 1.06),
    "fig14_100s": ("Fig. 14", "14B, 3 of 6 preempted 100 s in: overhead cut by migration vs recompute", 0.33),
    "fig14_200s": ("Fig. 14", "14B, 3 of 6 preempted 200 s in: overhead cut by migration vs recompute", 0.76),
    "fig16_break_even": ("Fig. 16", "14B on a trace: spot discount from which tokens per $ beat veRL", 0.30),
    "fig18_5k_best": ("Fig. 18", "14B, responses up to 5K: best instance count", 3.0),
    "fig18_14k_best": ("Fig. 18", "14B, responses up to 14K: best instance count", 6.0),
    "fig18_5k_throughput": ("Fig. 18", "14B, up to 5K, best count: throughput over reserved only", 1.47),
    "fig18_14k_throughput": ("Fig. 18", "14B, up to 14K, best count: throughput over reserved only", 2.22),
    "fig18_5k_tokens_per_usd": ("Fig. 18", "14B, up to 5K, best count: tokens per $ over reserved only", 1.24),
    "fig18_14k_tokens_per_usd": ("Fig. 18", "14B, up to 14K, best count: tokens per $ over reserved only", 1.61),
}

# The paper's traces are Bamboo's with half of the instances sampled (not bundled): a run
# "on a trace" here follows the seeded synthetic trace in that style (preemption storms about
# hourly taking about half of the instances, each back after about 30 minutes; cluster.traces
# SyntheticTraceConfig's defaults), up to 6 instances (Fig. 11's largest count), at its own
# pace; its seed is the segment (A, B, C = 0, 1, 2).
TRACE_INSTANCES = 6
SYNTHETIC_TRACE_S = 6 * 3600.0
# Notices of GCP spot VMs (30 s; the paper's a3-highgpu-2g) for rlboost; the published system
# reacts to none (with_reference_mechanisms makes every preemption sudden).
NOTICE_S = 30.0
# A sample may lose its instance this many times in a step on the trace: its storms take half
# of the instances within minutes, so a sample can meet several in a step; a step the published
# system's 5 attempts per group would fail is counted here rather than ended (the figures are
# throughput and cost, and a failed step would end the run).
TRACE_RETRY_BUDGET = 20
MAX_LENGTHS = (5_120, 8_192, 11_264, 14_336)  # Fig. 18's responses, 5K to 14K
# Fig. 12: 5 of 6 instances killed 100 s into steps 4 and 8, each replaced at once (the paper's
# replayer starts a new instance when one goes, if one is available; it then starts and pulls).
FIG12_PREEMPT = ((4, 100.0, 5, 0.0), (8, 100.0, 5, 0.0))
# Fig. 14: 3 of 6 instances killed together 100 s or 200 s into step 4 (replaced at once); the
# overhead is that step's time over the same step without the preemption.
FIG14_STEP = 4
FIG14_OFFSETS = (100.0, 200.0)


@dataclass(frozen=True, slots=True)
class FigureRun:
    """One simulated run: a recipe, its mechanisms, its capacity, and the ablation what-ifs."""

    model: str = "14b"
    mechanisms: str = "reference"
    instances: int = 0  # fixed preemptible instances (with trace_seed None)
    trace_seed: int | None = None  # on the paper-style trace, this segment
    max_response: int = 14_336
    sim: tuple[tuple[str, object], ...] = field(default=())  # SimSpec what-ifs (field, value)

    def __post_init__(self) -> None:
        if self.model not in MODELS or self.mechanisms not in MECHANISMS:
            raise ValueError(f"model must be one of {sorted(MODELS)} and mechanisms one of {MECHANISMS}, "
                             f"got {self.model!r}, {self.mechanisms!r}")

    def config(self) -> RunConfig:
        c = MODELS[self.model]()
        task = dataclasses.replace(c.task, max_new_tokens=self.max_response // TOKEN_BLOCK)
        if self.trace_seed is None:
            cluster = dataclasses.replace(c.cluster, max_preemptible=self.instances,
                                          initial_preemptible=self.instances, trace="none")
        else:
            cluster = dataclasses.replace(c.cluster, trace="synthetic", max_preemptible=TRACE_INSTANCES,
                                          initial_preemptible=0, trace_duration_s=SYNTHETIC_TRACE_S / TIME_SCALE,
                                          seed=self.trace_seed, notice_s=NOTICE_S / TIME_SCALE)
            router = dataclasses.replace(c.controller.router, retry_budget=TRACE_RETRY_BUDGET)
            c = dataclasses.replace(c, controller=dataclasses.replace(c.controller, router=router))
        c = dataclasses.replace(c, task=task, cluster=cluster)
        if self.mechanisms == "rlboost" or not (self.instances or self.trace_seed is not None):
            return c  # reserved only is the same program either way
        return with_reference_mechanisms(c) if self.mechanisms == "reference" else artifact_setup(c)

    def spec_changes(self) -> dict:
        return dict(self.sim)

    def replace(self, **changes) -> FigureRun:
        return dataclasses.replace(self, **changes)


def reserved_only(model: str, max_response: int = 14_336) -> FigureRun:
    """veRL's setup in the model: the reserved cluster alone, colocated, synchronous."""
    return FigureRun(model=model, mechanisms="rlboost", instances=0, max_response=max_response)


def on_demand_instance_usd_h() -> float:
    """What a preemptible instance's GPUs cost on demand (the reserved node's price per GPU)."""
    return ON_DEMAND_NODE_USD_H / NODE_GPUS * ENGINE_GPUS


def spot_instance_usd_h() -> float:
    """A preemptible instance at the paper's spot price: a quarter of an 8x H100 spot node."""
    return SPOT_NODE_USD_H / NODE_GPUS * ENGINE_GPUS
