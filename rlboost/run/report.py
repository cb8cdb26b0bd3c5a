"""The summary of a run, computed from its run directory alone (metrics.jsonl and
events.jsonl), so `rlboost report RUN_DIR` can redo it for any run, finished or not.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TextIO

from rlboost.inputs import printable
from rlboost.run.directory import SUMMARY_FILE, RunDirectory
from rlboost.run.fidelity import run_fidelity
from rlboost.run.plots import plot_run
from rlboost.run.table import console, print_table, rich_text


def dollars(usd: float) -> str:
    """$1,234.56, or two significant digits under a cent ($0.00031), so a small cost still shows."""
    if usd == 0 or abs(usd) >= 0.01:
        return f"${usd:,.2f}"
    return f"${usd:.{1 - math.floor(math.log10(abs(usd)))}f}"

@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary:
    """What a run achieved, for the summary table.

    >>> RunSummary(steps=30, first_step=1, last_step=30, first_reward=0.45, last_reward=0.8,
    ...            tokens=48000, tokens_per_s=900.0, wall_s=120.0, usd=1.5, reserved_only_usd=2.5,
    ...            notices=2, sudden=1, samples_expected=960, samples_trained=960,
    ...            samples_duplicated=0, migrations=14, resumes=3).samples_lost
    0

    Cost: instance time of the reserved cluster and of each preemptible instance, billed
    at the configured prices. reserved_only_usd is an estimate, not a measurement: what the
    reserved instances alone would cost to generate the same tokens at the rate the
    reserved engines were measured at during their local windows (the rest of each step
    unchanged); 0 when the run holds too little to estimate it. bench/cost_efficiency.py
    measures both runs instead.

    sudden counts instances that ended without notice: killed by a preemption, or lost
    (their process or node died). restarts are the driver's relaunches from the last
    checkpoint after the controller or a trainer rank died or a step failed (restart_causes
    says what, in which step); the run's time from each checkpoint to the failure after it
    (restart_lost_s, summed) was redone, and it is billed: the instances were up meanwhile
    (and the reserved cluster stays billed while the run is launched again).

    usd includes egress_usd: the weight bytes instances pulled from the trainer
    (egress_bytes), at their pool's cost.egress_usd_per_gb.

    pool_empty_s: how long, of the run's pool_span_s (on the run's clock, from each launch to
    its last step, start-up included), no preemptible instance was placed (the reserved
    cluster alone); notice_sources counts the notices by what sent them (trace, hook, and
    each cloud). records_refused: records of the data set left out at load, by cause.

    fidelity says what the run is (real compute, or emulated engines and trainer that take
    a named GPU's time at a time_scale); an emulated run's rollout rate is also given in
    tokens per second of the modelled cluster (modelled_tokens_per_s).
    """

    steps: int
    first_step: int
    last_step: int
    first_reward: float
    last_reward: float
    tokens: int
    tokens_per_s: float
    wall_s: float
    usd: float
    reserved_only_usd: float
    notices: int
    sudden: int
    samples_expected: int
    samples_trained: int
    samples_duplicated: int
    migrations: int
    resumes: int
    restarts: int = 0
    restart_causes: tuple[str, ...] = ()
    restart_lost_s: float = 0.0
    egress_bytes: int = 0
    egress_usd: float = 0.0
    delta_pulls: int = 0
    weight_pulls: int = 0
    reward_failures: dict[str, int] | None = None  # samples whose reward function failed, by kind
    pool_empty_s: float = 0.0
    pool_span_s: float = 0.0
    notice_sources: tuple[tuple[str, int], ...] = ()
    deltas_served: int = 0     # published versions whose delta was served,
    deltas_declined: int = 0   # and those whose delta was declined (larger than transfer.delta_max_fraction)
    delta_ratio: float = 0.0   # median full size / delta size of the served ones
    values_changed: float | None = None  # median share of values changed per version (sampled)
    records_refused: dict[str, int] | None = None
    fidelity: str = ""
    modelled_tokens_per_s: float | None = None

    @property
    def samples_lost(self) -> int:
        return self.samples_expected - (self.samples_trained - self.samples_duplicated)

    @property
    def tokens_per_usd(self) -> float:
        return self.tokens / self.usd if self.usd > 0 else 0.0

    @property
    def reserved_only_tokens_per_usd(self) -> float:
        return self.tokens / self.reserved_only_usd if self.reserved_only_usd > 0 else 0.0

    def rows(self) -> list[tuple[str, str]]:
        gain = (self.tokens_per_usd / self.reserved_only_tokens_per_usd - 1.0
                if self.reserved_only_tokens_per_usd > 0 else 0.0)
        return [
            *([("what ran", self.fidelity)] if self.fidelity else []),
            ("steps", f"{self.steps} (step {self.first_step} to {self.last_step})"),
            ("mean reward, first step", f"{self.first_reward:.3f}"),
            ("mean reward, last step", f"{self.last_reward:.3f}"),
            ("tokens generated", f"{self.tokens:,}"),
            ("rollout tokens/s", f"{self.tokens_per_s:,.1f}" + (
                f" (emulated tokens per second of the run; {self.modelled_tokens_per_s:,.0f} tokens/s of the "
                "modelled cluster)" if self.modelled_tokens_per_s is not None else "")),
            ("wall time of the steps", f"{self.wall_s:,.1f} s"),
            ("tokens per dollar", f"{self.tokens_per_usd:,.0f}"),
            ("weight egress (pulled from the trainer, in tokens per dollar)",
             f"{self.egress_bytes / 1e9:,.3f} GB, {dollars(self.egress_usd)}; {self.delta_pulls} of "
             f"{self.weight_pulls} pulls took a delta"),
            ("weight deltas", self._deltas()),
            ("tokens per dollar, reserved only (estimate: the same tokens at the reserved "
             "engines' measured rate)", f"{self.reserved_only_tokens_per_usd:,.0f} "
                                        f"({gain:+.0%} with preemptible instances)"
             if self.reserved_only_usd > 0 else "not enough data to estimate"),
            ("preemptions survived", f"{self.notices + self.sudden} ({self.notices} with notice, "
                                     f"{self.sudden} sudden)"),
            ("notices by source", ", ".join(f"{n} {src}" for src, n in self.notice_sources) or "none"),
            ("preemptible pool empty", f"{self.pool_empty_s:,.1f} s of {self.pool_span_s:,.1f} s on the run's clock, "
                                       f"from each launch, start-up included "
                                       f"({self.pool_empty_s / self.pool_span_s:.0%})" if self.pool_span_s > 0
             else "n/a"),
            ("samples lost", f"{self.samples_lost}"),
            ("samples duplicated", f"{self.samples_duplicated}"),
            ("migrations (live / resumed after a loss)", f"{self.migrations} / {self.resumes}"),
            ("restarts from a checkpoint", self._restarts()),
            *self._reward_failures(),
            *self._refused(),
        ]

    def _deltas(self) -> str:
        """How the published versions travelled, and why deltas were declined."""
        changed = (f"{self.values_changed:.1%} of the values changed per version (median)"
                   if self.values_changed is not None else "")
        if not self.deltas_served and not self.deltas_declined:
            return "none published"
        text = (f"{self.deltas_served} served ({self.delta_ratio:,.1f}x smaller than the full version, median), "
                if self.deltas_served else "none served, ") + f"{self.deltas_declined} declined"
        if self.deltas_declined:
            text += (f"; declined: {changed or 'most values changed'}, so a delta would be larger than "
                     "transfer.delta_max_fraction of the version (deltas pay off when few bits change: "
                     "bfloat16 weights at small learning rates)")
        elif changed:
            text += f"; {changed}"
        return text

    def _reward_failures(self) -> list[tuple[str, str]]:
        if self.reward_failures is None:  # an older run directory, or a task's own reward
            return []
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.reward_failures.items(), key=lambda kv: -kv[1]))
        return [("reward failures (scored 0)", f"{sum(self.reward_failures.values())}" + (f" ({kinds})" if kinds else ""))]

    def _refused(self) -> list[tuple[str, str]]:
        if self.records_refused is None:  # an older run directory, or a task without a data set
            return []
        kinds = ", ".join(f"{n} {cause}" for cause, n in sorted(self.records_refused.items(), key=lambda kv: -kv[1]))
        return [("data set records refused at load", f"{sum(self.records_refused.values())}"
                 + (f" ({kinds})" if kinds else ""))]

    def _restarts(self) -> str:
        if not self.restarts:
            return "0"
        return (f"{self.restarts} ({'; '.join(self.restart_causes)}); {self.restart_lost_s:,.1f} s of run time "
                f"lost and redone, billed")

    def markdown(self, title: str) -> str:
        lines = [f"# {printable(title)}", "", "| | |", "|---|---|"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in self.rows()]
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A table cell of summary.md: what came from the run's files (causes, sources, kinds)
    with control characters escaped and pipes that would end the cell quoted."""
    return printable(text).replace("|", "\\|")


def summarize(run: RunDirectory, config: dict | None = None) -> RunSummary:
    """The summary of a run directory; config: its config.json as read (what ran)."""
    metrics, events = run.metrics(), run.events()
    if not metrics:
        raise ValueError(f"{run.path} has no metrics yet")
    first, last = metrics[0], metrics[-1]
    restarts = [e for e in events if e.get("kind") == "restart"]
    tokens = sum(int(m.get("total_tokens", 0)) for m in metrics)
    rollout_s = sum(float(m.get("rollout_time_s", 0.0)) for m in metrics)
    return RunSummary(
        steps=len(metrics), first_step=first["step"], last_step=last["step"],
        first_reward=float(first.get("reward_mean", float("nan"))),
        last_reward=float(last.get("reward_mean", float("nan"))),
        tokens=tokens, tokens_per_s=tokens / rollout_s if rollout_s > 0 else 0.0,
        wall_s=sum(float(m.get("step_wall_s", 0.0)) for m in metrics),
        usd=float(last.get("cost_usd", 0.0)), reserved_only_usd=reserved_only_estimate(metrics, events),
        notices=sum(1 for e in events if e["kind"] == "notice"),
        sudden=sum(1 for e in events if e["kind"] == "death"),
        samples_expected=sum(int(m.get("samples", 0)) for m in metrics),
        samples_trained=sum(int(m.get("samples_trained", 0)) for m in metrics),
        samples_duplicated=sum(int(m.get("samples_trained", 0)) - int(m.get("samples_unique", 0))
                               for m in metrics),
        migrations=sum(int(m.get("migrations", 0)) for m in metrics),
        resumes=sum(int(m.get("resumes", 0)) for m in metrics),
        restarts=len(restarts), restart_causes=tuple(str(e.get("cause", "?")) for e in restarts),
        restart_lost_s=sum(float(e.get("lost_s", 0.0)) for e in restarts),
        egress_bytes=sum(int(m.get("weight_egress_bytes", 0)) for m in metrics),
        egress_usd=float(last.get("egress_usd", 0.0)),
        delta_pulls=sum(int(m.get("weight_delta_pulls", 0)) for m in metrics),
        weight_pulls=sum(int(m.get("pulls", 0)) for m in metrics),
        **_pool_empty(events, float(last.get("elapsed_s", 0.0))), notice_sources=_notice_sources(events),
        reward_failures=_reward_failures(metrics), **delta_summary(metrics),
        records_refused=_records_refused(metrics), **run_fidelity(config or {}, tokens / rollout_s if rollout_s > 0 else 0.0))


def _records_refused(metrics: list[dict]) -> dict[str, int] | None:
    refused = metrics[-1].get("records_refused")  # written by runs on a data set only
    if not isinstance(refused, dict):
        return None
    return {str(k): int(v) for k, v in refused.items()}


def delta_summary(metrics: list[dict]) -> dict:
    """Served and declined deltas of the published versions (each counted once), with the
    median size ratio and share of values changed, from metrics' publish_delta."""
    deltas = {}
    for m in metrics:
        d = m.get("publish_delta")
        if isinstance(d, dict) and "target" in d and "error" not in d:
            deltas[d["target"]] = d
    served = [d for d in deltas.values() if not d.get("declined")]
    ratios = [float(d["target_bytes"]) / float(d["bytes"]) for d in served if float(d.get("bytes", 0)) > 0]
    changed = [float(d["values_changed"]) for d in deltas.values() if d.get("values_changed") is not None]
    return {"deltas_served": len(served), "deltas_declined": len(deltas) - len(served),
            "delta_ratio": _median(ratios) or 0.0, "values_changed": _median(changed)}


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _notice_sources(events: list[dict]) -> tuple[tuple[str, int], ...]:
    """Notices per source: a cloud's are counted under its name (aws, gcp, azure)."""
    counts: dict[str, int] = {}
    for e in events:
        if e.get("kind") == "notice":
            name = e.get("cloud") or e.get("source") or "trace"
            counts[name] = counts.get(name, 0) + 1
    return tuple(sorted(counts.items()))


def _pool_empty(events: list[dict], end_s: float) -> dict:
    """Seconds without a placed preemptible instance, from each launch to the next one (or to
    end_s, the last step's end), read from the counts instance events carry."""
    empty = span = 0.0
    since = up = None  # this launch's start, and the instances up since the last event
    last_t = 0.0
    for e in sorted(events, key=lambda e: float(e.get("t", 0.0))):
        t = min(float(e.get("t", 0.0)), end_s)
        if e.get("kind") == "launch" or since is None:
            if since is not None:
                span += last_t - since
            since, up, last_t = t, 0, t
        if up == 0:
            empty += t - last_t
        last_t = t
        if "preemptible_up" in e:
            up = int(e["preemptible_up"])
    if since is not None and end_s > last_t:
        empty += (end_s - last_t) if up == 0 else 0.0
        last_t = end_s
    if since is not None:
        span += last_t - since
    return {"pool_empty_s": empty, "pool_span_s": span}


def _reward_failures(metrics: list[dict]) -> dict[str, int] | None:
    if not any("reward_failures_by_kind" in m for m in metrics):
        return None
    total: dict[str, int] = {}
    for m in metrics:
        for kind, n in m.get("reward_failures_by_kind", {}).items():
            total[kind] = total.get(kind, 0) + int(n)
    return total


def reserved_only_estimate(metrics: list[dict], events: list[dict] = ()) -> float:
    """Dollars the reserved instances alone would need for the run's tokens: each step's
    rollout and trainer wait replaced by its tokens at the reserved engines' measured rate
    (reserved tokens per second of local window), billed at the run's reserved $/s.

    The rate is measured over the steps in which every reserved engine was up: from a
    reserved engine's death to the step its replacement is active, the window runs with
    fewer engines (or none), which would make the reserved cluster look slower than it is."""
    last = metrics[-1]
    reserved_usd, elapsed = float(last.get("reserved_usd", 0.0)), float(last.get("elapsed_s", 0.0))
    down = _reserved_down_steps(events, int(last.get("step", 0)))
    whole = [m for m in metrics if m.get("step") not in down]
    reserved_tokens = sum(n for m in whole for iid, n in m.get("tokens_per_instance", {}).items()
                          if iid.startswith("reserved-"))
    window_s = sum(float(m.get("window_s", 0.0)) for m in whole)
    if reserved_usd <= 0 or elapsed <= 0 or reserved_tokens <= 0 or window_s <= 0:
        return 0.0
    rate = reserved_tokens / window_s
    tokens = sum(int(m.get("total_tokens", 0)) for m in metrics)
    wall = sum(float(m.get("step_wall_s", 0.0)) for m in metrics)
    rest = sum(float(m.get(k, 0.0)) for m in metrics for k in ("phase_rollout_s", "phase_wait_s"))
    extra_s = (wall - rest + tokens / rate) - wall  # how much longer (or shorter) the steps would take
    return max(0.0, reserved_usd + reserved_usd / elapsed * extra_s)


def write_report(run: RunDirectory, *, echo: bool = True, file: TextIO | None = None) -> RunSummary:
    """Redraw the plots, write summary.md and (echo) print the summary table on `file`
    (default stderr: a script reads the run directory alone from stdout)."""
    plot_run(run)
    summary = summarize(run, _config(run))
    run.write_summary(summary.markdown(f"Run {run.path.name}"))
    if echo:
        print_table(summary.rows(), f"rlboost run {run.path.name}", file or sys.stderr)
        console(file or sys.stderr).print(rich_text(f"run directory: {run.path}  (plots in {run.plots_dir})"))
    return summary


def report_directory(run: RunDirectory, file: TextIO) -> None:
    """`rlboost report`: a training run's plots and summary redone and its table printed; a
    simulation's folder is left as `rlboost simulate` wrote it (its figures are the
    simulator's, which metrics.jsonl alone cannot redo) and its summary printed as it stands."""
    if run.simulated:
        from rlboost.inputs import read_text

        text = read_text(run.path / SUMMARY_FILE)
        print("\n".join(printable(line) for line in text.splitlines()), file=file)
        print(f"(a simulation's folder: its summary and plots are the simulation's own, left as they are; "
              f"{run.path})", file=file)
        return
    write_report(run, file=file)


def _config(run: RunDirectory) -> dict:
    try:
        config = run.read_config()
    except (OSError, ValueError):  # no config.json (an older or a handed-over folder): no fidelity line
        return {}
    return config if isinstance(config, dict) else {}


def _reserved_down_steps(events: list[dict], last_step: int) -> set[int]:
    """Steps (up to last_step) during which a reserved engine was dead or its replacement
    not yet active."""
    down: set[int] = set()
    since: dict[str, int] = {}  # reserved engine -> step of its death
    for e in events:
        iid, step = e.get("instance"), int(e.get("step", 0))
        if e.get("kind") == "launch":  # a new launch starts every engine afresh
            for since_step in since.values():
                down.update(range(since_step, step))
            since.clear()
        if e.get("pool") != "reserved" and not str(iid).startswith("reserved-"):
            continue
        if e.get("kind") == "death":
            since.setdefault(iid, step)
        elif e.get("kind") == "active" and iid in since:
            down.update(range(since.pop(iid), step + 1))
    for step in since.values():  # never replaced: down to the end of the run
        down.update(range(step, last_step + 1))
    return down
