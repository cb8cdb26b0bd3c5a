"""The RLBoost paper's figures beside the timing model's predictions, simulated: the published
mechanisms (reference mode) first, then rlboost's at the same points, each over the paper's
figure with the ratio. Nothing is fitted: the timing model's inputs are independent
measurements (rlboost/timing_inputs.toml) and every run is a paper recipe with the figure's
setup (rlboost.recipes.paper_figures).

Checks, in order: verl's reserved-only baseline (10.4k tokens/s) and the artifact's 1-4 worker
curve (Qwen3-8B); Fig. 10 (three models on a trace in the paper's style, over reserved only);
Fig. 11 (14B, 1 and 6 fixed instances); Fig. 12 (seeding off, window memory off, with 5 of 6
instances preempted and replaced twice); Fig. 14 (3 of 6 preempted 100 s and 200 s into a step:
the step-time overhead token-level migration saves against recomputing from the prompt);
Fig. 16 (the spot discount from which tokens per $ beat reserved only); Fig. 18 (responses up
to 5K and 14K: the best instance count and its gains).

    python bench/paper_figures.py                  # every figure (about 15 minutes on 2 busy cores)
    python bench/paper_figures.py --figures 10,11  # some of them
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

FIGURES = ("verl", "artifact", "10", "11", "12", "14", "16", "18")
MISS = 0.15  # a prediction off the published figure by more than this is called a miss


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figures", default=",".join(FIGURES), help=f"which checks, of {','.join(FIGURES)}")
    p.add_argument("--steps", type=int, default=12, help="steps of each fixed-capacity run")
    p.add_argument("--trace-steps", type=int, default=20, help="steps of each run on the trace")
    p.add_argument("--skip", type=int, default=2, help="first steps not counted (>= 1)")
    p.add_argument("--segments", type=int, default=3, help="trace segments (seeds) of Figs. 10 and 16")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides for every run (e.g. task.groups_per_step=16 for a quick look)")
    p.add_argument("--decode-speed", type=float, default=1.0,
                   help="what-if: every engine decodes at this times the timing model (a sensitivity, never a fit)")
    p.add_argument("--train-speed", type=float, default=1.0,
                   help="what-if: the trainer's passes at this times the timing model's speed (a sensitivity)")
    p.add_argument("--out", default=None, help="results markdown (default bench/results/paper_figures_<host>_<date>.md)")
    args = p.parse_args()
    args.figures = tuple(f.strip() for f in args.figures.split(",") if f.strip())
    if not set(args.figures) <= set(FIGURES):
        raise SystemExit(f"--figures must name some of {','.join(FIGURES)}, got {','.join(args.figures)}")
    if not 1 <= args.skip < min(args.steps, args.trace_steps) or args.segments < 1:
        raise SystemExit("--skip must be in [1, min(--steps, --trace-steps)) and --segments >= 1")
    return args


class Runs:
    """Simulated runs, each once: figures over the steps after `skip`, and every step's wall."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.cache, self.seconds = args, {}, 0.0

    def get(self, run, steps: int | None = None) -> dict:
        steps = steps or (self.args.trace_steps if run.trace_seed is not None else self.args.steps)
        key = (run, steps)
        if key not in self.cache:
            changes = run.spec_changes() | {k: getattr(self.args, k) for k in ("decode_speed", "train_speed")
                                            if getattr(self.args, k) != 1.0}
            from rlboost.config.overrides import apply_overrides

            self.cache[key] = self._simulate(apply_overrides(run.config(), self.args.set), changes, steps)
        return self.cache[key]

    def _simulate(self, config, changes: dict, steps: int) -> dict:
        from rlboost.run.simulate import sim_spec, task_groups
        from rlboost.sim.metrics import summarize
        from rlboost.sim.simulator import Simulator

        t0 = time.perf_counter()
        spec = sim_spec(config, steps=steps).replace(**changes)
        result = Simulator(spec, groups=task_groups(config)).run()
        s = summarize(result, skip=min(self.args.skip, steps - 1))
        self.seconds += time.perf_counter() - t0
        reserved = config.cost.reserved_usd_per_hour * s.seconds / 3600.0
        return {"tokens_per_s": s.tokens_per_s, "tokens_per_usd": s.tokens_per_usd, "tokens": s.tokens,
                "reserved_usd": reserved, "preemptible_usd": max(0.0, s.usd - reserved), "window_s": s.window_s,
                "step_s": s.seconds / s.steps, "mean_preemptible": s.mean_preemptible,
                "walls": [st.wall_s * spec.time_scale for st in result.steps]}


def ratio(fig: dict, base: dict, key: str) -> float:
    return fig[key] / base[key]


def verl_rows(runs: Runs, mode: str) -> dict:
    from rlboost.recipes.paper_figures import reserved_only
    from rlboost.sim.calibrate import VERL_BASELINE_TOKENS_PER_S

    base = runs.get(reserved_only("8b"))
    return {"verl_8b_tokens_per_s": (base["tokens_per_s"], VERL_BASELINE_TOKENS_PER_S)}


def artifact_rows(runs: Runs, mode: str) -> dict:
    """The artifact's 1-4 workers: its own setup (reference) or rlboost at the same counts."""
    from rlboost.recipes.paper_figures import FigureRun
    from rlboost.recipes.paper_qwen3_8b import ARTIFACT_MEASURED_TOKENS_PER_S

    out = {}
    for n in (1, 2, 3, 4):
        fig = runs.get(FigureRun(model="8b", mechanisms="artifact" if mode == "reference" else mode, instances=n))
        out[f"artifact_{n}_workers_tokens_per_s"] = (fig["tokens_per_s"], ARTIFACT_MEASURED_TOKENS_PER_S[n])
    return out


def fig10_rows(runs: Runs, mode: str) -> dict:
    from rlboost.recipes.paper_figures import PUBLISHED, FigureRun, reserved_only

    out = {}
    for model in ("8b", "14b", "32b"):
        base = runs.get(reserved_only(model))
        segs = [runs.get(FigureRun(model=model, mechanisms=mode, trace_seed=s)) for s in range(runs.args.segments)]
        for key in ("throughput", "tokens_per_usd"):
            name = f"fig10_{model}_{key}"
            field = "tokens_per_s" if key == "throughput" else "tokens_per_usd"
            out[name] = (statistics.mean(ratio(f, base, field) for f in segs), PUBLISHED[name][2])
    return out


def fig11_rows(runs: Runs, mode: str) -> dict:
    from rlboost.recipes.paper_figures import PUBLISHED, FigureRun, reserved_only

    base, out = runs.get(reserved_only("14b")), {}
    for n in (1, 6):
        fig = runs.get(FigureRun(model="14b", mechanisms=mode, instances=n))
        out[f"fig11_{n}_throughput"] = (ratio(fig, base, "tokens_per_s"), PUBLISHED[f"fig11_{n}_throughput"][2])
        out[f"fig11_{n}_tokens_per_usd"] = (ratio(fig, base, "tokens_per_usd"),
                                            PUBLISHED[f"fig11_{n}_tokens_per_usd"][2])
    return out


def fig12_rows(runs: Runs, mode: str) -> dict:
    from rlboost.recipes.paper_figures import FIG12_PREEMPT, PUBLISHED, FigureRun

    full = FigureRun(model="14b", mechanisms=mode, instances=6, sim=(("preempt", FIG12_PREEMPT),))
    with_ = runs.get(full)
    out = {"fig12_no_seeding": (ratio(runs.get(full.replace(sim=full.sim + (("seeding", False),))), with_,
                                      "tokens_per_s"), PUBLISHED["fig12_no_seeding"][2])}
    if mode == "reference":  # rlboost's window policy keeps no per-count memory
        out["fig12_no_memory"] = (ratio(runs.get(full.replace(sim=full.sim + (("window_memory", False),))), with_,
                                        "tokens_per_s"), PUBLISHED["fig12_no_memory"][2])
    return out


def fig14_rows(runs: Runs, mode: str) -> dict:
    from rlboost.recipes.paper_figures import FIG14_OFFSETS, FIG14_STEP, PUBLISHED, FigureRun

    steps, out = FIG14_STEP + 1, {}
    quiet = runs.get(FigureRun(model="14b", mechanisms=mode, instances=6), steps)["walls"][FIG14_STEP - 1]
    for offset in FIG14_OFFSETS:
        over = {}
        for migration in ("continue", "recompute"):
            run = FigureRun(model="14b", mechanisms=mode, instances=6,
                            sim=(("preempt", ((FIG14_STEP, offset, 3, 0.0),)), ("migration", migration)))
            over[migration] = runs.get(run, steps)["walls"][FIG14_STEP - 1] - quiet
        # no overhead to cut when the rollout was over before the preemption (None: not defined)
        cut = 1.0 - over["continue"] / over["recompute"] if over["recompute"] >= 1.0 else None
        out[f"fig14_{offset:.0f}s"] = (cut, PUBLISHED[f"fig14_{offset:.0f}s"][2])
    return out


def fig16_rows(runs: Runs, mode: str) -> dict:
    """The discount from which the 14B trace runs' tokens per $ reach reserved only's (spot
    dollars scale with the price; throughput does not)."""
    from rlboost.recipes.paper_figures import (
        PUBLISHED,
        FigureRun,
        on_demand_instance_usd_h,
        reserved_only,
        spot_instance_usd_h,
    )

    base = runs.get(reserved_only("14b"))
    cuts = []
    for s in range(runs.args.segments):
        f = runs.get(FigureRun(model="14b", mechanisms=mode, trace_seed=s))
        price = (f["tokens"] / base["tokens_per_usd"] - f["reserved_usd"]) / f["preemptible_usd"] * spot_instance_usd_h()
        cuts.append(1.0 - price / on_demand_instance_usd_h())
    return {"fig16_break_even": (statistics.mean(cuts), PUBLISHED["fig16_break_even"][2])}


def fig18_rows(runs: Runs, mode: str) -> dict:
    from rlboost.recipes.paper_figures import PUBLISHED, FigureRun, reserved_only

    out = {}
    for label, length in (("5k", 5_120), ("14k", 14_336)):
        base = runs.get(reserved_only("14b", length))
        figs = {n: runs.get(FigureRun(model="14b", mechanisms=mode, instances=n, max_response=length))
                for n in range(1, 7)}
        best = max(figs, key=lambda n: (figs[n]["tokens_per_usd"], -n))
        out[f"fig18_{label}_best"] = (float(best), PUBLISHED[f"fig18_{label}_best"][2])
        out[f"fig18_{label}_throughput"] = (ratio(figs[best], base, "tokens_per_s"),
                                            PUBLISHED[f"fig18_{label}_throughput"][2])
        out[f"fig18_{label}_tokens_per_usd"] = (ratio(figs[best], base, "tokens_per_usd"),
                                                PUBLISHED[f"fig18_{label}_tokens_per_usd"][2])
    return out


CHECKS = {"verl": verl_rows, "artifact": artifact_rows, "10": fig10_rows, "11": fig11_rows, "12": fig12_rows,
          "14": fig14_rows, "16": fig16_rows, "18": fig18_rows}


def render(rows: dict) -> str:
    from rlboost.recipes.paper_figures import PUBLISHED

    lines = [f"{'check':34}{'published':>10}{'reference':>11}{'ref/pub':>9}{'rlboost':>10}{'rlb/pub':>9}"
             f"{'rlb/ref':>9}  what"]
    for name, r in rows.items():
        pub, ref, rlb = r["published"], r.get("reference"), r.get("rlboost")
        if "reference" in r and ref is None or "rlboost" in r and rlb is None:
            what_note = "  (n/a: the rollout was over before the preemption)"
        else:
            what_note = ""
        what = PUBLISHED[name][0] + ": " + PUBLISHED[name][1] if name in PUBLISHED else r["what"]
        miss = "  MISS" if ref is not None and pub and abs(ref / pub - 1) > MISS else ""
        cells = [f"{pub:>10.3g}", f"{ref:>11.3g}" if ref is not None else f"{'-':>11}",
                 f"{ref / pub:>9.2f}" if ref is not None and pub else f"{'-':>9}",
                 f"{rlb:>10.3g}" if rlb is not None else f"{'-':>10}",
                 f"{rlb / pub:>9.2f}" if rlb is not None and pub else f"{'-':>9}",
                 f"{rlb / ref:>9.2f}" if rlb is not None and ref else f"{'-':>9}"]
        lines.append(f"{name:34}{''.join(cells)}  {what}{miss}{what_note}")
    return "\n".join(lines)


WHAT = {"verl_8b_tokens_per_s": "verl, Qwen3-8B reserved only: tokens/s (PolyRL REPRODUCE.md, 1,300 x 8)",
        **{f"artifact_{n}_workers_tokens_per_s": f"artifact, {n} worker(s): tokens/s (PolyRL REPRODUCE.md)"
           for n in (1, 2, 3, 4)}}


def measure(args: argparse.Namespace) -> tuple[dict, Runs]:
    runs, rows = Runs(args), {}
    for fig in args.figures:
        for mode in ("reference", "rlboost"):
            if fig == "verl" and mode == "rlboost":
                continue  # reserved only is one program
            print(f"simulating {fig} ({mode})...", file=sys.stderr, flush=True)
            for name, (value, published) in CHECKS[fig](runs, mode).items():
                rows.setdefault(name, {"published": published, "what": WHAT.get(name, "")})[mode] = value
    return rows, runs


def main() -> int:
    args = parse()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    t0 = time.perf_counter()
    rows, runs = measure(args)
    wall = time.perf_counter() - t0
    table = render(rows)
    misses = [n for n, r in rows.items() if r.get("reference") is not None and r["published"]
              and abs(r["reference"] / r["published"] - 1) > MISS]
    head = (f"The paper's figures and the timing model's predictions (simulated; {args.steps} steps a fixed run, "
            f"{args.trace_steps} on the trace, steps {args.skip + 1}.. counted, {args.segments} trace segment(s)); "
            f"{len(rows) - len(misses)} of {len(rows)} reference-mode predictions within {MISS:.0%} of the "
            f"published figure. {len(runs.cache)} runs in {runs.seconds / 60:.1f} min ({wall / 60:.1f} min in all), "
            f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}.")
    if args.decode_speed != 1.0 or args.train_speed != 1.0 or args.set:
        head += (f" WHAT-IF, not the prediction: engines at {args.decode_speed:g} and the trainer at "
                 f"{args.train_speed:g} of the timing model's speed; overrides {args.set or 'none'}.")
    print(head)
    print(table)
    write_results(args, head, table)
    within = [abs(r["reference"] / r["published"] - 1) for r in rows.values()
              if r.get("reference") is not None and r["published"]]
    print(json.dumps({"metric": "reference_predictions_within_15_percent", "value": len(within) - len(misses),
                      "unit": "checks", "ceiling": len(within),
                      "peers": {n: {k: round(v, 4) for k, v in r.items() if isinstance(v, float)}
                                for n, r in rows.items()}}))
    return 0


def write_results(args: argparse.Namespace, head: str, table: str) -> None:
    theme = "paper_figures"
    if args.decode_speed != 1.0 or args.train_speed != 1.0:
        theme += f"_whatif_decode{args.decode_speed:g}_train{args.train_speed:g}"
    out = Path(args.out) if args.out else (Path(__file__).parent / "results" /
                                           f"{theme}_{platform.machine()}-{os.cpu_count()}c_{date.today()}.md")
    cmd = "python bench/paper_figures.py " + " ".join(sys.argv[1:])
    out.write_text(f"# The paper's figures, simulated, {platform.machine()}, {date.today()}\n\n"
                   f"Command: `{cmd.strip()}`\n\n{head}\n\n```\n{table}\n```\n")


if __name__ == "__main__":
    sys.exit(main())
