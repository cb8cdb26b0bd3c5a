"""`rlboost simulate`: a named scenario through the discrete-event simulator, into a run
directory like train's (config.json, metrics.jsonl, summary.md, plots/), with a progress bar.

The scenario's prompts come from the run's own task feed, so a simulation rolls out exactly
the samples (and lengths) an emulated run of the same config does.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from rlboost import env
from rlboost.config.overrides import apply_overrides, to_dict
from rlboost.config.run import RunConfig
from rlboost.recipes.paper_qwen3_8b import ARTIFACT_MEASURED_TOKENS_PER_S, PROMPT_TOKENS
from rlboost.recipes.scenarios import Scenario, get_scenario
from rlboost.run.directory import SCENARIO_FILE, RunDirectory
from rlboost.run.terminal import say
from rlboost.sim.calibrate import VERL_BASELINE_TOKENS_PER_S, baseline_tokens_per_s, scale_to_meet
from rlboost.sim.metrics import summarize
from rlboost.sim.report import SaturationPoint, headline, plot_saturation, plot_steps, step_record, summary_markdown
from rlboost.sim.simulator import Simulator
from rlboost.sim.spec import SimSpec

MIN_STEPS = 2  # the first step warms up; the figures are measured after it
PLAN_SKIP = 2  # a plan's runs leave out start-up and the window's first adjustment


def sim_spec(config: RunConfig, *, steps: int | None = None, round_s: float | None = None) -> SimSpec:
    return SimSpec.of(config, prompt_tokens=PROMPT_TOKENS, steps=steps).replace(round_s=round_s)


def task_groups(config: RunConfig) -> Callable[[int], list]:
    """The run's prompt groups per step (its task feed), as an emulated run draws them."""
    from rlboost.trainer.feed import task_feed
    from rlboost.trainer.starting_weights import prepare_checkpoint

    return task_feed(config.task, prepare_checkpoint(config.model, config.task)).groups


def with_instances(config: RunConfig, n: int) -> RunConfig:
    cluster = dataclasses.replace(config.cluster, max_preemptible=n, initial_preemptible=n, trace="none")
    return dataclasses.replace(config, cluster=cluster)


def simulate(name: str, overrides: list[str], *, steps: int | None = None, progress: bool = True,
             echo: Callable[[str], None] = say) -> Path:
    """Run the scenario (with --set overrides); returns its run directory (config.json,
    scenario.json, metrics.jsonl, summary.md and summary.json, plots/), which is removed
    again when the simulation fails."""
    if steps is not None and steps < MIN_STEPS:
        raise ValueError(f"--steps must be at least {MIN_STEPS} (the first step warms up; the figures are measured "
                         f"after it), got {steps}")
    scenario = get_scenario(name)
    config = apply_overrides(scenario.config(), overrides)
    if scenario.planner:
        from rlboost.run.sweep import plan_sweep

        groups = task_groups(config)

        def summary(n: int, sweep_steps: int):
            spec = sim_spec(with_instances(config, n), steps=sweep_steps, round_s=scenario.round_s)
            return summarize(Simulator(spec, groups=groups).run(), skip=min(PLAN_SKIP, sweep_steps - 1))

        return plan_sweep(scenario, config, summary, steps=steps, echo=echo)
    spec = sim_spec(config, steps=scenario.steps if steps is None else steps, round_s=scenario.round_s)
    groups = task_groups(config)
    run = RunDirectory.create(env.run_root(), f"{scenario.name}-simulated")
    try:
        _simulate(scenario, config, overrides, spec, groups, run, steps, progress, echo)
    except BaseException:
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    return run.path


def _simulate(scenario: Scenario, config: RunConfig, overrides: list[str], spec: SimSpec, groups, run: RunDirectory,
              steps: int | None, progress: bool, echo: Callable[[str], None]) -> None:
    run.drop_unfinished_checkpoints()  # a simulation holds no checkpoint
    run.write_config(to_dict(config))
    (run.path / SCENARIO_FILE).write_text(json.dumps({"scenario": scenario.name, "steps": spec.steps,
                                                      "round_s": spec.round_s, "overrides": overrides}, indent=2))
    records = _main_run(spec, groups, run, progress)
    if steps is not None:  # a shorter run asks for a shorter sweep too
        scenario = dataclasses.replace(scenario, sweep_steps=max(2, min(scenario.sweep_steps, steps)))
    sweep, sweep_s = _sweep(scenario, config, groups, echo)
    base = next((p.summary for p in sweep if p.instances == 0), None)
    if base is None:  # the headline needs reserved only: a short run of it
        base = summarize(Simulator(sim_spec(with_instances(config, 0), steps=scenario.sweep_steps,
                                            round_s=scenario.round_s), groups=groups).run())
    main = summarize(records[1])
    _report(scenario, spec, run, records, sweep, sweep_s, base)
    for line in headline(sweep, base, main, label=f"{scenario.name} (this run)"):
        echo(line)


def _main_run(spec: SimSpec, groups, run: RunDirectory, progress: bool) -> tuple:
    from tqdm import tqdm

    bar = tqdm(total=spec.steps, desc="simulate", unit="step", disable=not progress, dynamic_ncols=True)
    records: list[dict] = []

    def on_step(rec) -> None:
        record = step_record(rec, spec.time_scale, spec.token_block)
        records.append(record)
        run.append_metrics(record)
        bar.set_postfix_str(f"tok/s={record['tokens_per_s']:.0f} up={record['preemptible_up']} "
                            f"offload={record['offload_share']:.0%}", refresh=False)
        bar.update(1)

    t0 = time.perf_counter()
    try:
        result = Simulator(spec, groups=groups).run(progress=on_step)
    finally:
        bar.close()
    return records, result, time.perf_counter() - t0


def _sweep(scenario: Scenario, config: RunConfig, groups, echo) -> tuple[list[SaturationPoint], float]:
    """Short runs at each instance count of the scenario's sweep (the saturation curve)."""
    if not scenario.sweep:
        return [], 0.0
    t0 = time.perf_counter()
    points = []
    for n in scenario.sweep:
        spec = sim_spec(with_instances(config, n), steps=scenario.sweep_steps, round_s=scenario.round_s)
        points.append(SaturationPoint(n, summarize(Simulator(spec, groups=groups).run())))
    seconds = time.perf_counter() - t0
    echo(f"saturation sweep: {len(points)} instance counts x {scenario.sweep_steps} steps in {seconds:.1f} s")
    return points, seconds


def _by_instances(records: list[dict], scenario: str) -> list[str]:
    """Mean tokens/s over the steps (after the first) that ended with each count of preemptible
    instances up; the artifact's measured figure beside it in the artifact scenario."""
    counts: dict[int, list[float]] = {}
    for r in records[1:]:
        c = counts.setdefault(r["preemptible_up"], [0.0, 0.0, 0])
        c[0] += r["tokens"]
        c[1] += r["wall_s"]
        c[2] += 1
    if len(counts) < 2:
        return []
    measured = scenario == "artifact"
    lines = ["", "## By preemptible instances up", "", "| instances | steps | tokens/s |"
             + (" artifact measured | prediction / measured |" if measured else ""),
             "|---|---|---|" + ("---|---|" if measured else "")]
    for n, (tokens, wall, steps) in sorted(counts.items()):
        rate = tokens / wall if wall else 0.0
        row = f"| {n} | {steps} | {rate:.0f} |"
        if measured and n in ARTIFACT_MEASURED_TOKENS_PER_S:
            row += f" {ARTIFACT_MEASURED_TOKENS_PER_S[n]:.0f} | {rate / ARTIFACT_MEASURED_TOKENS_PER_S[n]:.2f} |"
        elif measured:
            row += " - | - |"
        lines.append(row)
    return lines


def _report(scenario: Scenario, spec: SimSpec, run: RunDirectory, main: tuple, sweep: list[SaturationPoint],
            sweep_s: float, base) -> None:
    records, result, seconds = main
    summary = summarize(result)
    notes = [f"Scenario `{scenario.name}`: {scenario.description}.",
             f"Controller round every {(spec.round_s or spec.controller.poll_interval_s) * spec.time_scale:g} "
             f"modelled seconds; time_scale {spec.time_scale:g}, token_block {spec.token_block}.",
             "Response lengths are assumed, not measured (the artifact publishes none): "
             f"{_lengths(spec)}."]
    if result.trace_pace:
        notes.append(f"Capacity: {result.trace_pace}.")
    if sweep:
        notes.append(f"Saturation sweep: {len(sweep)} instance counts x {scenario.sweep_steps} steps, "
                     f"{sweep_s:.1f} s.")
    text = summary_markdown(f"Simulation: {scenario.name}", summary, seconds, spec.steps, sweep, notes)
    text += "\n".join(["## Headline against reserved only", "", "```", *headline(sweep, base, summary, label="this run"),
                       "```", *_by_instances(records, scenario.name)]) + "\n"
    run.write_summary(text)
    (run.path / "summary.json").write_text(json.dumps({"scenario": scenario.name, "sim_seconds": round(seconds, 2),
                                                       "sweep_seconds": round(sweep_s, 2), **summary.as_dict(),
                                                       "saturation": [{"instances": p.instances,
                                                                       **p.summary.as_dict()} for p in sweep]},
                                                      indent=2))
    plot_steps(records, run.plots_dir / "steps.png", title=f"Simulated {scenario.name}")
    if sweep:
        plot_saturation(sweep, run.plots_dir / "saturation.png", title=f"Simulated {scenario.name}")


def _lengths(spec: SimSpec) -> str:
    emu = spec.rollout.emulated
    L = emu.lengths
    cap = spec.max_new_tokens * emu.token_block
    if L.kind != "lognormal":
        return f"geometric, stop probability {emu.stop_probability:g} per token, cap {cap:,}"
    return (f"log-normal, median {L.median_tokens:,.0f} tokens, log-sd {L.prompt_sigma:g} per prompt and "
            f"{L.sample_sigma:g} per sample, cap {cap:,} (mean {L.mean_tokens(cap):,.0f})")


def calibrate_paper(echo: Callable[[str], None] = say, steps: int = 40) -> float:
    """The timing model's check against verl's reserved-only baseline (10.4k tokens/s): the
    prediction, its gap, and the factor on every efficiency that would close it (not applied)."""
    config = get_scenario("paper").config()
    spec, groups = sim_spec(config, steps=steps), task_groups(config)
    predicted = baseline_tokens_per_s(spec, groups=groups)
    echo(f"reserved only, predicted from the measured inputs: {predicted:,.0f} tokens/s; verl measured "
         f"{VERL_BASELINE_TOKENS_PER_S:,.0f} ({predicted / VERL_BASELINE_TOKENS_PER_S - 1:+.1%})")
    if predicted <= VERL_BASELINE_TOKENS_PER_S:
        return 1.0
    scale = scale_to_meet(spec, groups=groups)
    echo(f"what-if, not applied: every efficiency at {scale} of its measured value would meet verl's figure")
    return scale
