"""Tokens per dollar with preemptible rollout instances against the reserved cluster alone.

Runs the same short recipe twice through `rlboost.run.job.train` (real Ray actors, FSDP ranks,
controller, weight pulls, migrations, preemptions): (a) reserved only
(cluster.max_preemptible=0), (b) with the bundled spot trace. Both are billed from their
cost ledgers at the same $/hour prices (defaults: the recipe's CostConfig, $83.79/h
reserved and $21.28/h preemptible for one 8x H100 node), over the steps after the first
(the first includes warm-up). Two fidelity levels:

- emulated: rollout.backend=emulated. Every engine takes the time a GPU decoding at
  --decode-tps per engine and --sample-tps per sample would, so rollout dominates a step
  as it does on a GPU cluster, and each preemptible instance adds rollout capacity the
  way a GPU would; everything else is real. Tokens are hashes, so rewards are about 0.
- real: torch engines computing on this machine's cores. Here every instance shares the
  same few cores, so preemptible instances add cost but no compute: the gain says more
  about the host than about the system.

Ceiling: the ratio run (b) would reach if every preemptible instance-second it paid for
had generated tokens at the rate the reserved engine reached in run (a), i.e. preemptible
instances 100% utilised.

    python bench/cost_efficiency.py                      # both levels, tiny_cpu
    python bench/cost_efficiency.py --fidelity emulated --steps 20 --decode-tps 4000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

FIDELITIES = ("real", "emulated")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="tiny_cpu")
    p.add_argument("--fidelity", choices=(*FIDELITIES, "both"), default="both")
    p.add_argument("--steps", type=int, default=12, help="steps of each emulated run (the first is not counted)")
    p.add_argument("--real-steps", type=int, default=10, help="steps of each real run (the first is not counted)")
    p.add_argument("--reserved-usd-per-hour", type=float, default=None,
                   help="price of one reserved instance-hour (default: the recipe's cost.reserved_usd_per_hour)")
    p.add_argument("--preemptible-usd-per-hour", type=float, default=None,
                   help="price of one preemptible instance-hour (default: the recipe's)")
    p.add_argument("--decode-tps", type=float, default=8000.0, help="emulated: aggregate decode tok/s per engine")
    p.add_argument("--sample-tps", type=float, default=400.0, help="emulated: decode tok/s of one sample")
    p.add_argument("--max-new", type=int, default=96, help="emulated: max_new_tokens of a sample")
    p.add_argument("--stop-probability", type=float, default=0.01,
                   help="emulated: chance that a token ends its sample")
    p.add_argument("--groups", type=int, default=64, help="emulated: prompt groups per step")
    p.add_argument("--drain-margin", type=float, default=2.0,
                   help="emulated: seconds before a noticed instance's deadline that its samples leave")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more overrides for every run, as `rlboost train --set`")
    return p.parse_args()


def emulated_overrides(args: argparse.Namespace) -> list[str]:
    """The recipe with emulated engines and responses long enough that rollout dominates."""
    return ["rollout.backend=emulated", f"rollout.emulated.decode_tokens_per_s={args.decode_tps}",
            f"rollout.emulated.sample_tokens_per_s={args.sample_tps}",
            f"rollout.emulated.stop_probability={args.stop_probability}",
            f"task.max_new_tokens={args.max_new}", f"task.groups_per_step={args.groups}",
            f"trainer.microbatch_groups={max(1, args.groups // 4)}",
            # samples leave a noticed instance 2 s before its deadline, so it works through
            # the rest of its grace (the recipe drains at once, to show live migration)
            f"controller.registry.drain_margin_s={args.drain_margin}"]


def run_once(recipe: str, overrides: list[str]) -> list[dict]:
    """One training run through the job's own code path; its metrics, one dict per step."""
    from rlboost.config.overrides import apply_overrides
    from rlboost.recipes import get_recipe
    from rlboost.run.job import train

    return train(apply_overrides(get_recipe(recipe), overrides)).run.metrics()


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
            "offload_share": sum(float(m["offload_share"]) for m in rest) / len(rest),
            "rollout_share": rollout_s / wall}


def ideal_ratio(reserved: dict, spot: dict) -> float:
    """Run (b) with its reserved part as productive as run (a) and every preemptible
    instance-second producing at run (a)'s engine rate, over run (a)'s tokens per dollar."""
    tokens = reserved["tokens_per_s"] * spot["wall_s"] + reserved["engine_tokens_per_s"] * spot["preemptible_instance_s"]
    return (tokens / spot["usd"]) / reserved["tokens_per_usd"]


def run_pair(args: argparse.Namespace, fidelity: str, common: list[str], spot_price: float) -> dict:
    """Both runs at one fidelity level: their figures, the gain and its ceiling."""
    steps = args.steps if fidelity == "emulated" else args.real_steps
    level = [f"run.steps={steps}", f"run.checkpoint_every={steps}",
             *(emulated_overrides(args) if fidelity == "emulated" else []), *common]
    out = {"steps": steps}
    for name, extra in (("reserved_only", ["cluster.max_preemptible=0", "cluster.initial_preemptible=0"]),
                        ("with_preemptible", [])):
        print(f"running {fidelity} {name} ({steps} steps of {args.recipe})...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        out[name] = measure(run_once(args.recipe, level + extra), spot_price)
        print(f"  done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    out["gain"] = out["with_preemptible"]["tokens_per_usd"] / out["reserved_only"]["tokens_per_usd"]
    out["ceiling"] = ideal_ratio(out["reserved_only"], out["with_preemptible"])
    return out


def print_table(args: argparse.Namespace, pairs: dict, prices: tuple[float, float]) -> None:
    print(f"\ncost efficiency, {args.recipe}, steps 2..N counted; ${prices[0]}/h reserved, ${prices[1]}/h "
          f"preemptible; {platform.machine()} {os.cpu_count()} cores")
    if "emulated" in pairs:
        print(f"emulated: engines take the time of {args.decode_tps:g} tok/s per engine, {args.sample_tps:g} "
              f"tok/s per sample (max_new_tokens {args.max_new}); controller, pulls, migrations, "
              "preemptions and trainer real")
    if "real" in pairs:
        print("real: torch engines on this machine's cores (every instance shares them)")
    print(f"{'fidelity':<10}{'run':<18}{'steps':>6}{'tokens':>9}{'wall s':>8}{'tokens/s':>10}{'rollout':>9}"
          f"{'usd':>8}{'tokens/$':>10}{'offload':>9}{'spot inst-s':>12}")
    for fidelity, pair in pairs.items():
        for name in ("reserved_only", "with_preemptible"):
            r = pair[name]
            print(f"{fidelity:<10}{name:<18}{r['steps']:>6}{r['tokens']:>9}{r['wall_s']:>8.1f}"
                  f"{r['tokens_per_s']:>10.1f}{r['rollout_share']:>9.0%}{r['usd']:>8.3f}{r['tokens_per_usd']:>10.0f}"
                  f"{r['offload_share']:>9.0%}{r['preemptible_instance_s']:>12.1f}")
    for fidelity, pair in pairs.items():
        a, b = pair["reserved_only"], pair["with_preemptible"]
        print(f"{fidelity}: tokens per dollar gain {pair['gain']:.3f}x (ideal with fully used preemptible "
              f"instances {pair['ceiling']:.3f}x); throughput ratio {b['tokens_per_s'] / a['tokens_per_s']:.3f}x")


def summary_line(pairs: dict) -> dict:
    """The JSON line: the emulated level's gain (the real one's when only it ran)."""
    main_level = "emulated" if "emulated" in pairs else "real"
    pair = pairs[main_level]
    peers = {"reserved_only": round(pair["reserved_only"]["tokens_per_usd"], 1),
             "with_preemptible": round(pair["with_preemptible"]["tokens_per_usd"], 1),
             "tokens_per_s_reserved_only": round(pair["reserved_only"]["tokens_per_s"], 1),
             "tokens_per_s_with_preemptible": round(pair["with_preemptible"]["tokens_per_s"], 1)}
    if main_level == "emulated" and "real" in pairs:
        real = pairs["real"]
        peers.update(real_compute_gain=round(real["gain"], 4), real_compute_ceiling=round(real["ceiling"], 4),
                     real_reserved_only=round(real["reserved_only"]["tokens_per_usd"], 1),
                     real_with_preemptible=round(real["with_preemptible"]["tokens_per_usd"], 1))
    return {"metric": "tokens_per_dollar_gain", "fidelity": main_level, "value": round(pair["gain"], 4),
            "unit": "x", "ceiling": round(pair["ceiling"], 4), "peers": peers}


def main() -> int:
    args = parse()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RLBOOST_RUN_ROOT", tempfile.mkdtemp(prefix="rlboost-cost-"))
    from rlboost.recipes import get_recipe

    cost = get_recipe(args.recipe).cost
    reserved_price = args.reserved_usd_per_hour if args.reserved_usd_per_hour is not None else cost.reserved_usd_per_hour
    spot_price = (args.preemptible_usd_per_hour if args.preemptible_usd_per_hour is not None
                  else cost.preemptible_usd_per_hour)
    common = ["run.progress=false", f"cost.reserved_usd_per_hour={reserved_price}",
              f"cost.preemptible_usd_per_hour={spot_price}", *args.set]
    levels = FIDELITIES if args.fidelity == "both" else (args.fidelity,)
    pairs = {fidelity: run_pair(args, fidelity, common, spot_price) for fidelity in reversed(levels)}
    print_table(args, pairs, (reserved_price, spot_price))
    print(json.dumps(summary_line(pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
