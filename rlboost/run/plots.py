"""PNG plots of a run: reward and throughput per step, preemptible instances and
preemptions over the steps, and time per phase of each step; each with its legend beside
the data and a caption under it that says what it shows.

Reads only the run directory (metrics.jsonl, events.jsonl, config.json when present), so
`rlboost report` can redraw them for any run, finished or not, old ones included.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from rlboost.run.directory import RunDirectory  # noqa: E402
from rlboost.run.partial_files import writing  # noqa: E402
from rlboost.run.timeline import StepClock, Timeline, read_timeline  # noqa: E402

NOTICE, SUDDEN = "tab:orange", "tab:red"
RELAUNCH = {"resume": ("tab:purple", "-.", "resumed from a checkpoint"),
            "restart": ("tab:brown", "--", "restarted after a failure")}
# Phases in the order a step runs them, with what each one is.
PHASES = {
    "pull": "pull: reserved engines load the step's weights",
    "rollout": "rollout: local window, the reserved engines generate",
    "train": "train: the trainer computes on complete groups",
    "wait": "wait: the trainer idles until groups still generating finish",
    "publish": "publish: the new weights are gathered and served",
}


def plot_run(run: RunDirectory) -> list[Path]:
    """Draw every plot the run's data allows; return the files written."""
    metrics, events = run.metrics(), run.events()
    timeline = read_timeline(metrics, events)
    written = []
    if metrics:
        written.append(_reward_and_throughput(metrics, timeline, run.plots_dir / "reward_throughput.png"))
        phases = _phase_order(metrics)
        if phases:
            written.append(_phases(metrics, phases, timeline, run.plots_dir / "phases.png"))
        if any("staleness_tokens" in m for m in metrics):
            written.append(_staleness(metrics, run.plots_dir / "staleness.png"))
    if events:
        written.append(_availability(timeline, _max_preemptible(run), run.plots_dir / "availability.png"))
    return written


def _max_preemptible(run: RunDirectory) -> int | None:
    try:
        return int(run.read_config()["cluster"]["max_preemptible"])
    except (OSError, ValueError, KeyError, TypeError):  # no or an older config.json
        return None


def _reward_and_throughput(metrics: list[dict[str, Any]], timeline: Timeline, out: Path) -> Path:
    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    reward = ax.plot(steps, [m.get("reward_mean", float("nan")) for m in metrics], "o-", ms=3,
                     color="tab:blue", label="mean reward (left axis)")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward", color="tab:blue")
    ax2 = ax.twinx()
    tps = ax2.plot(steps, [m.get("tokens_per_s", float("nan")) for m in metrics], "s--", ms=3,
                   color="tab:green", label="rollout tokens/s (right axis)")
    ax2.set_ylabel("rollout tokens/s", color="tab:green")
    ax2.set_ylim(bottom=0)
    handles = reward + tps + _relaunch_lines(ax, timeline, offset=0.5)
    _finish_step_axis(ax)
    ax.set_title("Reward and rollout throughput per step")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.12, 1.0), fontsize=8, frameon=False)
    return _save(fig, out, "Each point is one training step: the mean reward of its samples (left axis) "
                           "and its rollout throughput, tokens generated per second of the step's "
                           "rollout by all instances together (right axis).")


def _availability(timeline: Timeline, max_preemptible: int | None, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.8))
    handles = []
    for seg in timeline.segments:
        if not seg.x:
            continue
        xs = seg.x + [seg.end_x if seg.end_x is not None else seg.x[-1]]
        placed = ax.step(xs, seg.placed + seg.placed[-1:], where="post", color="tab:blue", lw=1.0,
                         alpha=0.55, label="placed (billed: starting, serving or draining)")
        serving = ax.step(xs, seg.serving + seg.serving[-1:], where="post", color="tab:blue", lw=2.4,
                          label="serving (active, no notice)")
        if not handles:  # one legend entry for every launch's lines
            handles += placed + serving
    handles += _preemption_marks(ax, timeline)
    handles += _relaunch_lines(ax, timeline, offset=0.0)
    top = max(timeline.peak_placed, max_preemptible or 0, 1)
    if max_preemptible is not None:
        handles.append(ax.axhline(max_preemptible, color="0.4", ls=":", lw=1,
                                  label=f"cluster.max_preemptible = {max_preemptible}"))
    ax.set_ylim(-0.15, top + 0.6)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("preemptible instances")
    if timeline.axis == "step":
        ax.set_xlabel("training step")
        ax.set_xlim(timeline.clock.steps[0], timeline.clock.last)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _minutes_on_top(ax, timeline.clock)
    else:
        ax.set_xlabel("minutes since the run started (the metrics hold no step times)")
    ax.grid(alpha=0.3)
    ax.set_title("Preemptible instances and preemptions", pad=28 if timeline.axis == "step" else None)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return _save(fig, out, "Preemptible instances during the run. Thin line: placed and billed; thick "
                           "line: serving samples. A triangle is a preemption notice, shaded until the "
                           "instance was reclaimed; a cross is a sudden preemption. After a resume or "
                           "restart every instance starts again, so the count rises from 0.")


def _minutes_on_top(ax: Any, clock: StepClock) -> None:
    """Above each step tick, the run's clock in minutes there (steps vary in length, so a
    linear minute scale would crowd its labels where steps are slow)."""
    top = ax.secondary_xaxis("top")
    lo, hi = ax.get_xlim()
    ticks = [x for x in ax.get_xticks() if lo <= x <= hi]
    top.set_xticks(ticks)  # kept when it redraws
    # a short run reads in seconds; otherwise minutes with as many decimals as it takes for
    # neighbouring ticks not to show the same time
    unit, per_min = ("seconds", 60.0) if clock.minutes_at(clock.last) < 2 else ("minutes", 1.0)
    times = [float(clock.minutes_at(x)) * per_min for x in ticks]
    decimals = next((d for d in range(3) if len({f"{t:.{d}f}" for t in times}) == len(times)), 2)
    top.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{float(clock.minutes_at(x)) * per_min:.{decimals}f}"))
    top.set_xlabel(f"{unit} since the run started", fontsize=8)
    top.tick_params(labelsize=8)


def _preemption_marks(ax: Any, timeline: Timeline) -> list:
    handles = []
    on_top = ax.get_xaxis_transform()  # x in data, y in axes fraction: marks along the top edge
    notices = [m for m in timeline.marks if m.kind == "notice"]
    sudden = [m for m in timeline.marks if m.kind == "sudden"]
    last = max((s.end_x for s in timeline.segments if s.end_x is not None), default=None)
    for m in notices:  # a grace period the log does not see end runs to the log's end
        until = m.until_x if m.until_x is not None else (last if last is not None else m.x)
        ax.axvspan(m.x, max(until, m.x), color=NOTICE, alpha=0.15, lw=0)
    if notices:
        handles += ax.plot([m.x for m in notices], [0.97] * len(notices), "v", color=NOTICE, ms=7,
                           transform=on_top, clip_on=False, ls="",
                           label=f"preemption with notice ({_by_source(notices)}), shaded until reclaimed")
    if sudden:
        for m in sudden:
            ax.axvline(m.x, color=SUDDEN, lw=0.8, ls=":")
        handles += ax.plot([m.x for m in sudden], [0.97] * len(sudden), "X", color=SUDDEN, ms=7,
                           transform=on_top, clip_on=False, ls="",
                           label=f"sudden preemption, killed without notice ({_by_source(sudden)})")
    return handles


def _by_source(marks: list) -> str:
    """"3" or, when the log names who decided them, "3: 2 aws, 1 hook"."""
    counts: dict[str, int] = {}
    for m in marks:
        if m.source:
            counts[m.source] = counts.get(m.source, 0) + 1
    named = ", ".join(f"{n} {src}" for src, n in sorted(counts.items()))
    return f"{len(marks)}: {named}" if named else str(len(marks))


def _relaunch_lines(ax: Any, timeline: Timeline, offset: float) -> list:
    """Vertical lines where the run resumed or restarted; offset moves them from the step
    boundary (availability) to between two steps' points or bars (per-step plots)."""
    handles = []
    if timeline.axis != "step":
        return handles
    for kind, (color, ls, label) in RELAUNCH.items():
        marks = [m for m in timeline.marks if m.kind == kind]
        for i, m in enumerate(marks):
            line = ax.axvline(round(m.x) + offset if offset else m.x, color=color, ls=ls, lw=1.4,
                              label=f"{label} (before step {round(m.x) + 1})" if len(marks) == 1 else label)
            if i == 0:
                handles.append(line)
    return handles


def _phase_order(metrics: list[dict[str, Any]]) -> list[str]:
    present = {k[len("phase_"):-len("_s")] for m in metrics for k in m
               if k.startswith("phase_") and k.endswith("_s")}
    return [p for p in PHASES if p in present] + sorted(present - set(PHASES))


def _phases(metrics: list[dict[str, Any]], phases: list[str], timeline: Timeline, out: Path) -> Path:
    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bottom = [0.0] * len(metrics)
    handles = []
    for name in phases:
        values = [float(m.get(f"phase_{name}_s", 0.0)) for m in metrics]
        handles.append(ax.bar(steps, values, bottom=bottom, label=PHASES.get(name, name.replace("_", " "))))
        bottom = [b + v for b, v in zip(bottom, values)]
    handles += _relaunch_lines(ax, timeline, offset=0.5)
    _finish_step_axis(ax)
    ax.set_ylabel("seconds")
    ax.set_title("Time per phase of each step")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return _save(fig, out, "Wall time of each step, split by phase and stacked bottom to top in the "
                           "order a step runs them. 'wait' is time the trainer sat idle because the "
                           "groups it needed were still being generated (mostly on preemptible "
                           "instances after the local window closed).")


def _staleness(metrics: list[dict[str, Any]], out: Path) -> Path:
    """Bounded staleness: the share of each step's trained tokens by how many versions they
    lag (stacked bars), and the behaviour importance weights (lines, right axis)."""
    rows = [m for m in metrics if "staleness_tokens" in m]
    steps, lags = [m["step"] for m in rows], max(len(m["staleness_tokens"]) for m in rows)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bottom, handles = [0.0] * len(rows), []
    for lag in range(lags):
        share = [(m["staleness_tokens"][lag] if lag < len(m["staleness_tokens"]) else 0)
                 / max(1, sum(m["staleness_tokens"])) for m in rows]
        handles.append(ax.bar(steps, share, bottom=bottom, alpha=0.6,
                              label=f"tokens {lag} version{'s' if lag != 1 else ''} behind"))
        bottom = [b + s for b, s in zip(bottom, share)]
    ax.set_ylabel("share of trained tokens")
    ax2 = ax.twinx()
    for key, style, label in (("is_weight_mean", "o-", "mean importance weight (right axis)"),
                              ("is_truncated_share", "s--", "share of weights truncated (right axis)")):
        handles += ax2.plot(steps, [m.get(key, float("nan")) for m in rows], style, ms=3, color="k"
                            if key == "is_weight_mean" else "tab:red", label=label)
    ax2.set_ylim(bottom=0)
    _finish_step_axis(ax)
    ax.set_title("Staleness of the trained tokens, and their importance weights")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.12, 1.0), fontsize=8, frameon=False)
    return _save(fig, out, "Each bar is one training step: its trained output tokens by how many weight "
                           "versions behind the step's own they were generated (controller.max_staleness "
                           "bounds it). Lines: the mean behaviour importance weight pi_prox/pi_behav and "
                           "the share of tokens whose weight was truncated at grpo.is_weight_cap.")


def _finish_step_axis(ax: Any) -> None:
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _save(fig: Any, out: Path, caption: str) -> Path:
    fig.tight_layout()
    fig.text(0.01, -0.01, textwrap.fill(caption, 120), ha="left", va="top", fontsize=8, color="0.25")
    # into a new file renamed over `out`: a link left in a handed-over run directory is
    # replaced, never written through
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        with writing(tmp):
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), "wb") as f:
                fig.savefig(f, format="png", dpi=110, bbox_inches="tight")  # tight: the caption and outer legend
            os.replace(tmp, out)
    except BaseException:  # a Ctrl-C mid-save leaves the old plot and no half of a new one
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return out
