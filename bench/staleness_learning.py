"""What bounded staleness learns: final reward, reward against samples and wall time, and the
share of truncated importance weights, from the metrics.jsonl of finished runs.

The runs are `rlboost train` runs named <prefix>_s<N>_seed<S> (N = controller.max_staleness),
e.g. made with

    for seed in 0 1 2; do for s in 0 1 2; do
      RLBOOST_RUN_ROOT=runs/staleness rlboost train --recipe tiny_cpu --set controller.max_staleness=$s \\
        --set run.seed=$seed --set task.seed=$seed --set run.name=tiny_s${s}_seed${seed}
    done; done

    python bench/staleness_learning.py --root runs/staleness --prefix tiny --last 10

Prints a table per staleness (the peer is staleness 0, strict on-policy, from the same
root), writes a plot under bench/results/, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAME = re.compile(r"^(?P<prefix>.+)_s(?P<staleness>\d+)_seed(?P<seed>\d+)-")
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


def read_runs(root: Path, prefix: str) -> dict[int, dict[int, list[dict]]]:
    """staleness -> seed -> the run's metrics, step by step (the newest run of each name);
    a run that has not reached its config's run.steps yet is left out, and said so."""
    runs: dict[int, dict[int, list[dict]]] = defaultdict(dict)
    for d in sorted(root.iterdir()):
        m = NAME.match(d.name)
        if not m or m["prefix"] != prefix or not (d / "metrics.jsonl").is_file():
            continue
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
        if rows and rows[-1]["step"] < _planned_steps(d, rows[-1]["step"]):
            print(f"left out (unfinished, {len(rows)} steps): {d.name}")
        elif rows:
            runs[int(m["staleness"])][int(m["seed"])] = sorted(rows, key=lambda r: r["step"])
    return runs


def _planned_steps(run_dir: Path, default: int) -> int:
    try:
        return int(json.loads((run_dir / "config.json").read_text())["run"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):  # no config.json: take the run as it is
        return default


def summary(rows: list[dict], last: int) -> dict:
    """One run's figures: final mean reward (its last `last` steps), time, and staleness."""
    stale = [sum(r.get("staleness_tokens", [0])[1:]) for r in rows]
    tokens = [sum(r.get("staleness_tokens", [0])) for r in rows]
    trained = sum(tokens)
    return {"steps": len(rows), "final_reward": statistics.fmean(r["reward_mean"] for r in rows[-last:]),
            "wall_s": rows[-1]["elapsed_s"], "samples": sum(r["samples_trained"] for r in rows),
            "stale_token_share": sum(stale) / trained if trained else 0.0,
            "is_truncated_share": _weighted(rows, "is_truncated_share", tokens),
            "is_weight_mean": _weighted(rows, "is_weight_mean", tokens)}


def _weighted(rows: list[dict], key: str, tokens: list[int]) -> float:
    pairs = [(r[key], t) for r, t in zip(rows, tokens) if key in r and t]
    total = sum(t for _, t in pairs)
    return sum(v * t for v, t in pairs) / total if total else float("nan")


def plot(runs: dict[int, dict[int, list[dict]]], out: Path, title: str) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for n, seeds in sorted(runs.items()):
        for i, (seed, rows) in enumerate(sorted(seeds.items())):
            samples, total = [], 0
            for r in rows:
                total += r["samples_trained"]
                samples.append(total)
            label = f"max_staleness={n}" if i == 0 else None
            color = COLORS[n % len(COLORS)]
            a.plot(samples, [r["reward_mean"] for r in rows], color=color, lw=1, alpha=0.8, label=label)
            b.plot([r["elapsed_s"] / 60 for r in rows], [r["reward_mean"] for r in rows], color=color, lw=1,
                   alpha=0.8, label=label)
    a.set_xlabel("samples trained")
    b.set_xlabel("wall time, minutes since the run started")
    a.set_ylabel("mean reward of the step")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    b.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("runs/staleness"))
    ap.add_argument("--prefix", default="tiny")
    ap.add_argument("--last", type=int, default=10, help="steps the final mean reward averages over")
    ap.add_argument("--hardware", default="cpu2", help="named in the plot's file name and title")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    runs = read_runs(args.root, args.prefix)
    if 0 not in runs:
        raise SystemExit(f"no staleness-0 runs named {args.prefix}_s0_seed<S> under {args.root}: the peer is missing")
    table = {n: {seed: summary(rows, args.last) for seed, rows in seeds.items()} for n, seeds in sorted(runs.items())}
    print(f"{'staleness':>9} {'seeds':>5} {'final reward':>13} {'per seed':>22} {'wall min':>9} "
          f"{'stale tokens':>12} {'IS mean':>8} {'IS truncated':>12}")
    agg = {}
    for n, per_seed in table.items():
        finals = [s["final_reward"] for s in per_seed.values()]
        agg[n] = {"final_reward": statistics.fmean(finals),
                  "final_reward_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
                  "seeds": sorted(per_seed), "wall_min": statistics.fmean(s["wall_s"] for s in per_seed.values()) / 60,
                  "stale_token_share": statistics.fmean(s["stale_token_share"] for s in per_seed.values()),
                  "is_truncated_share": _mean_finite(s["is_truncated_share"] for s in per_seed.values()),
                  "is_weight_mean": _mean_finite(s["is_weight_mean"] for s in per_seed.values())}
        a = agg[n]
        print(f"{n:>9} {len(finals):>5} {a['final_reward']:>8.3f}±{a['final_reward_sd']:.3f} "
              f"{' '.join(f'{f:.3f}' for f in finals):>22} {a['wall_min']:>9.1f} {a['stale_token_share']:>12.3f} "
              f"{a['is_weight_mean']:>8.4f} {a['is_truncated_share']:>12.5f}")
    name = f"staleness_learning_{args.prefix}_{args.hardware}.png"
    plot(runs, args.out / name, f"{args.prefix}: reward against samples and wall time, per controller.max_staleness "
                                f"({args.hardware}; one line per seed)")
    print(f"plot: {args.out / name}")
    gap = agg[1]["final_reward"] - agg[0]["final_reward"] if 1 in agg else float("nan")
    print(json.dumps({"metric": f"{args.prefix}_final_reward_gap_staleness1_vs_0", "value": round(gap, 4),
                      "unit": f"mean reward, last {args.last} steps", "ceiling": 1.0,
                      "peers": {f"staleness_{n}": {k: (_json_number(v) if isinstance(v, float) else v)
                                                   for k, v in a.items()} for n, a in agg.items()}}))


def _json_number(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 4)  # NaN (no such weights: strict runs) is not JSON


def _mean_finite(values) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.fmean(vals) if vals else float("nan")


if __name__ == "__main__":
    main()
