"""What a simulation writes: one metrics line per step (in the modelled cluster's units), the
summary table, and the plots (tokens/s and instances per step; the saturation curve of
throughput and tokens per dollar against the number of preemptible instances).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from rlboost.sim.metrics import SimSummary  # noqa: E402
from rlboost.sim.simulator import SimStep  # noqa: E402


def step_record(rec: SimStep, scale: float, block: int) -> dict:
    """One step as metrics.jsonl holds it: modelled seconds, real tokens, dollars so far."""
    m = rec.metrics
    wall = rec.wall_s * scale
    tokens = m.total_tokens * block
    return {"step": m.step, "wall_s": round(wall, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
            "window_s": round(m.window_s * scale, 3), "rollout_time_s": round(m.rollout_time_s * scale, 3),
            "trainer_idle_s": round(m.trainer_idle_s * scale, 3), "rollout_idle_s": round(m.rollout_idle_s * scale, 3),
            "offload_share": round(m.offload_share, 4), "migrations": m.migrations, "resumes": m.resumes,
            "preemptions": m.preemptions, "deaths": m.deaths, "num_preemptible": m.num_preemptible,
            "preemptible_up": rec.preemptible_up, "cost_usd": round(rec.cost_usd, 4),
            "reserved_usd": round(rec.reserved_usd, 4)}


@dataclass(frozen=True, slots=True)
class SaturationPoint:
    instances: int
    summary: SimSummary


def summary_markdown(title: str, summary: SimSummary, sim_seconds: float, steps: int,
                     sweep: list[SaturationPoint], notes: list[str]) -> str:
    lines = [f"# {title}", "", *notes, "",
             f"Simulated {steps} steps in {sim_seconds:.1f} s; figures over steps 2..{steps} "
             "(modelled cluster time, real tokens).", "",
             "| figure | value |", "|---|---|"]
    for key, value in summary.as_dict().items():
        lines.append(f"| {key} | {value} |")
    if sweep:
        base = next((p.summary for p in sweep if p.instances == 0), sweep[0].summary)
        lines += ["", "## Saturation: benefit against preemptible instances", "",
                  "| instances | tokens/s | speedup | $/h | tokens per $ | gain |", "|---|---|---|---|---|---|"]
        for p in sweep:
            s = p.summary
            lines.append(f"| {p.instances} | {s.tokens_per_s:.0f} | {s.tokens_per_s / base.tokens_per_s:.2f}x | "
                         f"{s.usd_per_hour:.2f} | {s.tokens_per_usd:.0f} | "
                         f"{(s.tokens_per_usd / base.tokens_per_usd - 1) * 100:+.1f}% |")
    return "\n".join(lines) + "\n"


def plot_steps(records: list[dict], path: Path) -> None:
    """Tokens/s per step, with the preemptible instances up."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    steps = [r["step"] for r in records]
    ax.plot(steps, [r["tokens_per_s"] for r in records], lw=1, color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s (modelled)", color="tab:blue")
    twin = ax.twinx()
    twin.step(steps, [r["preemptible_up"] for r in records], where="post", color="tab:orange", lw=1)
    twin.set_ylabel("preemptible instances up", color="tab:orange")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_saturation(points: list[SaturationPoint], path: Path, ceiling: float | None = None) -> None:
    """Throughput and tokens per dollar against the number of preemptible instances."""
    base = next((p.summary for p in points if p.instances == 0), points[0].summary)
    xs = [p.instances for p in points]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [p.summary.tokens_per_s / base.tokens_per_s for p in points], "o-", label="throughput (x reserved only)")
    ax.plot(xs, [p.summary.tokens_per_usd / base.tokens_per_usd for p in points], "s-",
            label="tokens per $ (x reserved only)")
    if ceiling is not None:
        ax.axhline(ceiling, ls="--", color="grey", lw=1, label="trainer-bound ceiling")
    ax.set_xscale("symlog", linthresh=4)
    ax.set_xlabel("preemptible instances")
    ax.set_ylabel("x reserved only")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
