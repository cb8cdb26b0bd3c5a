"""Named simulations (`rlboost simulate --scenario NAME`): a recipe's config, how many steps to
simulate, and which instance counts the saturation sweep beside it covers.

Every scenario is a paper recipe (rlboost.recipes.paper_qwen3_8b, paper_qwen3_14b_32b) or a
variant of it, so a simulated figure can be set beside the emulated run of the same config. The
sweep scenarios plan spot capacity (rlboost.sim.planner): one short run per instance count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from rlboost.config.run import RunConfig
from rlboost.recipes.paper_qwen3_8b import (
    CONTROLLER_ROUND_S,
    artifact_workers,
    on_spot_trace,
    paper_qwen3_8b,
    with_reference_mechanisms,
)
from rlboost.recipes.paper_qwen3_14b_32b import paper_qwen3_14b, paper_qwen3_32b

SATURATION_COUNTS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 200)
PLAN_COUNTS = (0, 1, 2, 3, 4, 5, 6, 8)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A simulation: its config, steps, the simulated controller's round (None: its poll
    interval) and the instance counts of the saturation sweep (short runs, steps each)."""

    name: str
    description: str
    config: Callable[[], RunConfig]
    steps: int
    round_s: float | None = None
    sweep: tuple[int, ...] = ()
    sweep_steps: int = 12
    planner: bool = False  # a spot plan over the sweep's counts (no main run)


def _static(n: int, recipe: Callable[[], RunConfig] = paper_qwen3_8b) -> Callable[[], RunConfig]:
    def config() -> RunConfig:
        c = recipe()
        return dataclasses.replace(c, cluster=dataclasses.replace(c.cluster, max_preemptible=n,
                                                                  initial_preemptible=n, trace="none"))
    return config


SCENARIOS = {s.name: s for s in (
    Scenario("paper", "the artifact's shape: Qwen3-8B on one reserved 8x H100 node and 4 preemptible "
             "quarter-node instances", _static(4), steps=40, sweep=(0, 1, 2, 3, 4, 6, 8)),
    Scenario("paper-trace", "the paper recipe's preemptible instances following the bundled measured "
             "AWS spot trace (up to 4, 9 hours)", lambda: on_spot_trace(paper_qwen3_8b()), steps=40),
    Scenario("paper-trace-reference", "paper-trace with the published mechanisms (1/3 window rule, group "
             "trimming, push without relays)", lambda: with_reference_mechanisms(on_spot_trace(paper_qwen3_8b())),
             steps=40),
    Scenario("artifact", "the published system as its artifact ran: its mechanisms (window table, 1/3 gap rule, "
             "whole-group round-robin, group trimming), standalone workers at 0.6 of their memory, one added every "
             "1800 s to four, then the oldest killed and relaunched", lambda: artifact_workers(paper_qwen3_8b()),
             steps=36),
    Scenario("saturation", "200 preemptible instances for 400 steps, and where adding instances stops "
             "paying (the trainer bounds the step)", _static(200), steps=400, round_s=CONTROLLER_ROUND_S,
             sweep=SATURATION_COUNTS),
    *(Scenario(name, f"spot plan for {recipe.__name__}: tokens/s and tokens per $ against 0-8 preemptible instances "
               "and the spot discount, at the recipe's prices (--set cost.preemptible_usd_per_hour=... to ask about "
               "another)", _static(0, recipe), steps=8, sweep=PLAN_COUNTS, sweep_steps=8, planner=True)
      for name, recipe in (("sweep", paper_qwen3_8b), ("sweep-14b", paper_qwen3_14b), ("sweep-32b", paper_qwen3_32b))),
)}


def get_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}")
    return SCENARIOS[name]
