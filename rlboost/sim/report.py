"""What a simulation writes: one metrics line per step (in the modelled cluster's units), the
summary table, and the plots (tokens/s and instances per step; the saturation curve of
throughput and tokens per dollar against the number of preemptible instances).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlboost.sim.metrics import SimSummary, staleness_fields
from rlboost.sim.simulator import SimStep

# a sweep's knee: the first count at which the reserved GPUs roll out (local window) and wait
# for groups (trainer idle) for less than this share of the step together: from there on they
# train for most of the step, and the trainer, not the rollout, bounds it (what remains, about
# a seventh of the step at 200 instances in the paper recipe, is the last groups' tail and the
# publish, which more instances do not shorten)
KNEE_IDLE_SHARE = 0.25


def _pyplot():
    """matplotlib, imported when a plot is drawn (it costs a second at start-up otherwise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def step_record(rec: SimStep, scale: float, block: int) -> dict:
    """One step as metrics.jsonl holds it: modelled seconds, real tokens, dollars so far."""
    m = rec.metrics
    wall = rec.wall_s * scale
    tokens, generated = rec.sequence_tokens * block, m.total_tokens * block
    return {"step": m.step, "wall_s": round(wall, 3), "tokens": tokens, "generated_tokens": generated,
            "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
            "generated_tokens_per_s": round(generated / wall, 1) if wall > 0 else 0.0,
            "window_s": round(m.window_s * scale, 3), "rollout_time_s": round(m.rollout_time_s * scale, 3),
            "trainer_idle_s": round(m.trainer_idle_s * scale, 3), "rollout_idle_s": round(m.rollout_idle_s * scale, 3),
            "offload_share": round(m.offload_share, 4), "migrations": m.migrations, "resumes": m.resumes,
            "preemptions": m.preemptions, "deaths": m.deaths, "num_preemptible": m.num_preemptible,
            "preemptible_up": rec.preemptible_up, "cost_usd": round(rec.cost_usd, 4),
            "reserved_usd": round(rec.reserved_usd, 4)} | staleness_fields(rec.staleness, block)



@dataclass(frozen=True, slots=True)
class SaturationPoint:
    instances: int
    summary: SimSummary


def summary_markdown(title: str, summary: SimSummary, sim_seconds: float, steps: int,
                     sweep: list[SaturationPoint], notes: list[str]) -> str:
    lines = [f"# {title}", "", *notes, "",
             f"Simulated {steps} steps in {sim_seconds:.1f} s; figures over steps 2..{steps} "
             "(modelled cluster time, real tokens; tokens are prompt + response as the RLBoost artifact counts "
             "its throughput, generated_tokens the responses alone).", "",
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
        k = knee(sweep)
        lines += ["", f"The trainer bounds the step from {k} instances on (local window and trainer idle under "
                  f"{KNEE_IDLE_SHARE:.0%} of the step)." if k is not None else
                  f"The trainer does not bound the step in this sweep (local window and trainer idle take "
                  f"{KNEE_IDLE_SHARE:.0%} of the step or more at every count)."]
    return "\n".join(lines) + "\n"


def knee(points: list[SaturationPoint]) -> int | None:
    """The first instance count at which the local window and the trainer's idle time together
    take less than KNEE_IDLE_SHARE of the step (None: never in these points)."""
    for p in sorted(points, key=lambda p: p.instances):
        s = p.summary
        if p.instances > 0 and s.steps and s.window_s + s.trainer_idle_s < KNEE_IDLE_SHARE * s.seconds / s.steps:
            return p.instances
    return None


def headline(points: list[SaturationPoint], base: SimSummary, main: SimSummary | None = None,
             label: str = "this run") -> list[str]:
    """Terminal lines: tokens/s, speedup and tokens per $ against reserved only."""
    rows = [(f"{p.instances} instances", p.summary) for p in points if p.instances > 0]
    if main is not None:
        rows.insert(0, (label, main))
    out = [f"{'':24}{'tokens/s':>10}{'speedup':>9}{'tokens/$':>11}{'vs reserved':>13}",
           f"{'reserved only':24}{base.tokens_per_s:>10.0f}{1:>8.2f}x{base.tokens_per_usd:>11.0f}{0:>+12.1f}%"]
    for name, s in rows:
        out.append(f"{name:24}{s.tokens_per_s:>10.0f}{s.tokens_per_s / base.tokens_per_s:>8.2f}x"
                   f"{s.tokens_per_usd:>11.0f}{(s.tokens_per_usd / base.tokens_per_usd - 1) * 100:>+12.1f}%")
    return out


def plot_steps(records: list[dict], path: Path, title: str = "Simulation") -> None:
    """Tokens/s per step (prompt + response, and generated), with the preemptible instances up;
    step 1 (start-up, first pulls) is left out, as every figure leaves it out."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    shown = [r for r in records if r["step"] > 1] or records
    fig, ax = plt.subplots(figsize=(8, 3.8))
    steps = [r["step"] for r in shown]
    lines = ax.plot(steps, [r["tokens_per_s"] for r in shown], lw=1.2, color="tab:blue",
                    label="tokens/s, prompt + response")
    lines += ax.plot(steps, [r.get("generated_tokens_per_s", r["tokens_per_s"]) for r in shown], lw=1, ls=":",
                     color="tab:blue", label="tokens/s, generated")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s (modelled cluster)", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    twin = ax.twinx()
    up = [r["preemptible_up"] for r in shown]
    lines += twin.step(steps, up, where="post", color="tab:orange", lw=1, label="preemptible instances up")
    twin.set_ylabel("preemptible instances up", color="tab:orange")
    twin.set_ylim(0, max(up) + 1)
    twin.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(lines, [ln.get_label() for ln in lines], loc="lower right", fontsize=8)
    ax.set_title(f"{title}: throughput per step (step 1 left out)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_saturation(points: list[SaturationPoint], path: Path, ceiling: float | None = None,
                    title: str = "Simulation") -> None:
    """Throughput and tokens per dollar against the number of preemptible instances (a linear
    axis with the counts labelled), and the knee: where the trainer starts to bound the step."""
    plt = _pyplot()
    base = next((p.summary for p in points if p.instances == 0), points[0].summary)
    xs = [p.instances for p in points]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(xs, [p.summary.tokens_per_s / base.tokens_per_s for p in points], "o-", label="throughput (x reserved only)")
    ax.plot(xs, [p.summary.tokens_per_usd / base.tokens_per_usd for p in points], "s-",
            label="tokens per $ (x reserved only)")
    if ceiling is not None:
        ax.axhline(ceiling, ls="--", color="grey", lw=1, label="trainer-bound ceiling")
    k = knee(points)
    if k is not None:
        ax.axvline(k, ls="--", color="tab:red", lw=1, label=f"trainer starts to bound the step ({k} instances)")
    ax.set_xticks(_tick_counts(xs, k))
    ax.set_xlabel("preemptible instances")
    ax.set_title(f"{title}: benefit against preemptible instances", fontsize=10)
    ax.set_ylabel("x reserved only")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _tick_counts(xs: list[int], keep: int | None) -> list[int]:
    """The counts to label: each one, unless it would crowd the one before on a linear axis
    (at least 1/30 of the range apart); the first, the last and the knee always."""
    span = max(1, max(xs) - min(xs))
    ticks: list[int] = []
    for x in sorted(set(xs)):
        if not ticks or x - ticks[-1] >= span / 30 or x == max(xs):
            ticks.append(x)
    if keep is not None and keep not in ticks:
        ticks = sorted({*ticks, keep})
    return ticks
