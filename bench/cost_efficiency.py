"""Tokens per dollar with preemptible rollout instances against the reserved cluster alone.

Runs the same short recipe twice through `rlboost.job.train` (real Ray actors, FSDP ranks,
engines, weight pulls): (a) reserved only (cluster.max_preemptible=0), (b) with the
bundled spot trace. Both are billed from their cost ledgers at the same $/hour prices
(defaults: the recipe's CostConfig, $83.79/h reserved and $21.28/h preemptible for one
8x H100 node), over the steps after the first (the first includes warm-up).

Ceiling: the ratio run (b) would reach if every preemptible instance-second it paid for
had generated tokens at the rate the reserved engine reached in run (a), i.e. preemptible
instances 100% utilised. On a small shared CPU machine instances compete for the same
cores, so the measured gain can fall far below it (even below 1): read it with the host.

    python bench/cost_efficiency.py                 # tiny_cpu, 15 steps each
    python bench/cost_efficiency.py --steps 30 --reserved-usd-per-hour 98.32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="tiny_cpu")
    p.add_argument("--steps", type=int, default=15, help="steps of each run (the first is not counted)")
    p.add_argument("--reserved-usd-per-hour", type=float, default=None,
                   help="price of one reserved instance-hour (default: the recipe's cost.reserved_usd_per_hour)")
    p.add_argument("--preemptible-usd-per-hour", type=float, default=None,
                   help="price of one preemptible instance-hour (default: the recipe's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more overrides for both runs, as `rlboost train --set`")
    return p.parse_args()


def run_once(recipe: str, overrides: list[str]) -> list[dict]:
    """One training run through the job's own code path; its metrics, one dict per step."""
    from rlboost.job import train
    from rlboost.recipes import get_recipe
    from rlboost.recipes.overrides import apply_overrides

    run = train(apply_overrides(get_recipe(recipe), overrides))
    return run.metrics()


def measure(metrics: list[dict], preemptible_usd_per_hour: float) -> dict:
    """Figures over steps 2..N: cost and time deltas from the end of step 1."""
    first, rest = metrics[0], metrics[1:]
    tokens = sum(int(m["total_tokens"]) for m in rest)
    wall = sum(float(m["step_wall_s"]) for m in rest)
    usd = float(metrics[-1]["cost_usd"]) - float(first["cost_usd"])
    reserved_usd = float(metrics[-1]["reserved_usd"]) - float(first["reserved_usd"])
    rollout_s = sum(float(m["rollout_time_s"]) for m in rest)
    spot_usd = usd - reserved_usd
    return {"steps": len(rest), "tokens": tokens, "wall_s": wall, "usd": usd,
            "tokens_per_s": tokens / wall, "tokens_per_usd": tokens / usd,
            "engine_tokens_per_s": tokens / rollout_s if rollout_s > 0 else 0.0,
            "preemptible_instance_s": spot_usd / preemptible_usd_per_hour * 3600.0
            if preemptible_usd_per_hour > 0 else 0.0,
            "offload_share": sum(float(m["offload_share"]) for m in rest) / len(rest)}


def ideal_ratio(reserved: dict, spot: dict) -> float:
    """Run (b) with its reserved part as productive as run (a) and every preemptible
    instance-second producing at run (a)'s engine rate, over run (a)'s tokens per dollar."""
    tokens = reserved["tokens_per_s"] * spot["wall_s"] + reserved["engine_tokens_per_s"] * spot["preemptible_instance_s"]
    return (tokens / spot["usd"]) / reserved["tokens_per_usd"]


def main() -> int:
    args = parse()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RLBOOST_RUN_ROOT", tempfile.mkdtemp(prefix="rlboost-cost-"))
    from rlboost.recipes import get_recipe

    cost = get_recipe(args.recipe).cost
    reserved_price = args.reserved_usd_per_hour if args.reserved_usd_per_hour is not None else cost.reserved_usd_per_hour
    spot_price = (args.preemptible_usd_per_hour if args.preemptible_usd_per_hour is not None
                  else cost.preemptible_usd_per_hour)
    common = [f"run.steps={args.steps}", "run.progress=false", f"run.checkpoint_every={args.steps}",
              f"cost.reserved_usd_per_hour={reserved_price}", f"cost.preemptible_usd_per_hour={spot_price}",
              *args.set]
    results = {}
    for name, extra in (("reserved_only", ["cluster.max_preemptible=0", "cluster.initial_preemptible=0"]),
                        ("with_preemptible", [])):
        print(f"running {name} ({args.steps} steps of {args.recipe})...", file=sys.stderr, flush=True)
        results[name] = measure(run_once(args.recipe, common + extra), spot_price)
    a, b = results["reserved_only"], results["with_preemptible"]
    gain = b["tokens_per_usd"] / a["tokens_per_usd"]
    ceiling = ideal_ratio(a, b)

    print(f"\ncost efficiency, {args.recipe}, {args.steps} steps each (steps 2..{args.steps} counted); "
          f"${reserved_price}/h reserved, ${spot_price}/h preemptible; {platform.machine()} "
          f"{os.cpu_count()} cores")
    print(f"{'run':<18}{'tokens':>9}{'wall s':>9}{'tokens/s':>10}{'usd':>9}{'tokens/$':>10}"
          f"{'offload':>9}{'spot inst-s':>12}")
    for name, r in results.items():
        print(f"{name:<18}{r['tokens']:>9}{r['wall_s']:>9.1f}{r['tokens_per_s']:>10.1f}{r['usd']:>9.3f}"
              f"{r['tokens_per_usd']:>10.0f}{r['offload_share']:>9.0%}{r['preemptible_instance_s']:>12.1f}")
    print(f"tokens per dollar gain {gain:.3f}x (ideal with fully used preemptible instances {ceiling:.3f}x); "
          f"throughput ratio {b['tokens_per_s'] / a['tokens_per_s']:.3f}x")
    print(json.dumps({"metric": "tokens_per_dollar_gain", "value": round(gain, 4), "unit": "x",
                      "ceiling": round(ceiling, 4),
                      "peers": {"reserved_only": round(a["tokens_per_usd"], 1),
                                "with_preemptible": round(b["tokens_per_usd"], 1),
                                "tokens_per_s_reserved_only": round(a["tokens_per_s"], 1),
                                "tokens_per_s_with_preemptible": round(b["tokens_per_s"], 1)}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
