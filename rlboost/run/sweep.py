"""`rlboost simulate --scenario sweep`: the spot capacity plan of a recipe at its prices (the
reserved cluster's cost.reserved_usd_per_hour, an instance's cost.preemptible_usd_per_hour),
into a run directory: summary.md (the table), plan.json, plots/plan.png, and a headline line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from rlboost import env
from rlboost.config.overrides import to_dict
from rlboost.config.run import RunConfig
from rlboost.recipes.scenarios import Scenario
from rlboost.run.directory import RunDirectory
from rlboost.run.terminal import say
from rlboost.sim.metrics import SimSummary
from rlboost.sim.planner import headline as plan_headline
from rlboost.sim.planner import plan_spot, plan_table, plot_plan


def on_demand_instance_usd_h(config: RunConfig) -> float:
    """An instance's GPUs at the reserved cluster's price per GPU (the reserved GPUs are the
    trainer's, as in the paper recipes)."""
    return config.cost.reserved_usd_per_hour / config.trainer.world_size * config.rollout.emulated.gpus


def plan_sweep(scenario: Scenario, config: RunConfig, summary: Callable[[int, int], SimSummary], *,
               steps: int | None = None, echo: Callable[[str], None] = say) -> Path:
    """Simulate each count of the scenario's sweep (summary(n, steps): a short run with n
    instances) and write the plan; returns its run directory."""
    steps = max(2, steps or scenario.sweep_steps)
    t0 = time.perf_counter()
    plan = plan_spot(config.run.name, lambda n: summary(n, steps), scenario.sweep, reserved_usd_h=config.cost.reserved_usd_per_hour,
                     instance_usd_h=config.cost.preemptible_usd_per_hour,
                     on_demand_instance_usd_h=on_demand_instance_usd_h(config))
    seconds = time.perf_counter() - t0
    run = RunDirectory.create(env.run_root(), f"{scenario.name}-plan")
    run.write_config(to_dict(config))
    table, line = plan_table(plan), plan_headline(plan)
    note = (f"Simulated {len(plan.points)} instance counts x {steps} steps (figures over steps 3..{steps}, "
            f"modelled cluster) in {seconds:.1f} s. A discount is the spot price's cut from the instance's GPUs "
            f"on demand (${plan.on_demand_instance_usd_h:.2f}/h at the reserved price per GPU); break-even: the "
            "discount from which the count gives reserved only's tokens per $.")
    run.write_summary("\n".join([f"# Spot plan: {scenario.name}", "", scenario.description + ".", "", note, "",
                                 "```", *table, "```", "", line, ""]))
    (run.path / "plan.json").write_text(json.dumps({
        "scenario": scenario.name, "sim_seconds": round(seconds, 2), "steps": steps,
        "reserved_usd_per_hour": plan.reserved_usd_h, "instance_usd_per_hour": plan.instance_usd_h,
        "on_demand_instance_usd_per_hour": round(plan.on_demand_instance_usd_h, 4),
        "best_instances": plan.best(plan.instance_usd_h).instances,
        "stops_paying_after": plan.stops_paying(plan.instance_usd_h),
        "points": [{"instances": p.instances, "tokens_per_s": round(p.tokens_per_s, 1),
                    "tokens_per_usd": round(p.tokens_per_usd(plan.instance_usd_h), 1),
                    "instance_hours": round(p.instance_hours, 4)} for p in plan.points]}, indent=2))
    plot_plan(plan, run.plots_dir / "plan.png")
    for text in (*table, line, f"({seconds:.1f} s)"):
        echo(text)
    return run.path
