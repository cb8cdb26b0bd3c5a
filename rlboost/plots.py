"""PNG plots of a run: reward and throughput per step, instance availability and
preemptions over time, and time per phase of each step.

Reads only the run directory's metrics.jsonl and events.jsonl, so `rlboost report`
can redraw them for any run, finished or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

from rlboost.rundir import RunDirectory  # noqa: E402

PREEMPTION_KINDS = {"notice": ("orange", "preemption notice"), "death": ("red", "sudden preemption")}


def plot_run(run: RunDirectory) -> list[Path]:
    """Draw every plot the run's data allows; return the files written."""
    metrics, events = run.metrics(), run.events()
    written = []
    if metrics:
        written.append(_reward_and_throughput(metrics, run.plots_dir / "reward_throughput.png"))
        phases = sorted({k for m in metrics for k in m if k.startswith("phase_") and k.endswith("_s")})
        if phases:
            written.append(_phases(metrics, phases, run.plots_dir / "phases.png"))
    if events:
        written.append(_availability(events, run.plots_dir / "availability.png"))
    return written


def _reward_and_throughput(metrics: list[dict[str, Any]], out: Path) -> Path:
    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [m.get("reward_mean", float("nan")) for m in metrics], "o-", color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(steps, [m.get("tokens_per_s", float("nan")) for m in metrics], "s--", color="tab:green")
    ax2.set_ylabel("rollout tokens/s", color="tab:green")
    ax.set_title("Reward and throughput per step")
    ax.grid(alpha=0.3)
    return _save(fig, out)


def _availability(events: list[dict[str, Any]], out: Path) -> Path:
    times = [e["t"] for e in events if "up" in e]
    counts = [e["up"] for e in events if "up" in e]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if times:
        ax.step([0.0] + times, [0] + counts, where="post", color="tab:blue", label="preemptible instances up")
    for kind, (color, label) in PREEMPTION_KINDS.items():
        hits = [e["t"] for e in events if e["kind"] == kind]
        for i, t in enumerate(hits):
            ax.axvline(t, color=color, linestyle=":", label=label if i == 0 else None)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("instances")
    ax.set_title("Instance availability and preemptions")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out)


def _phases(metrics: list[dict[str, Any]], phases: list[str], out: Path) -> Path:
    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(metrics)
    for key in phases:
        values = [float(m.get(key, 0.0)) for m in metrics]
        ax.bar(steps, values, bottom=bottom, label=key[len("phase_"):-len("_s")].replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("Time per phase")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, out)


def _save(fig: Any, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
