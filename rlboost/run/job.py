"""`rlboost train`: streaming GRPO with rollout offloaded to preemptible instances.

Each step: the reserved engines (and whatever preemptible instances are up) roll out the
step's prompt groups with weight version k; the trainer trains on complete groups as they
arrive, steps the optimizer, and publishes version k+1, which every instance pulls.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.placement import check_local, local_gpus
from rlboost.cluster.session import RaySession, join_address
from rlboost.config.run import RunConfig, check_multi_node
from rlboost.environments.factory import environment_kind
from rlboost.errors import ConfigError, RlboostError, RunFailed, RunInterrupted
from rlboost.models.checkpoint import verify_checkpoint_dir
from rlboost.rollout.factory import check_installed
from rlboost.run.checkpoints import checkpoint_state, last_checkpoint_step, open_run, resume_weights, save_checkpoint
from rlboost.run.directory import RunDirectory
from rlboost.run.launch import Cluster, TracePlan, capacity_kind, gpu_needs, plan_trace, ray_settings
from rlboost.run.metrics import Phases, step_record
from rlboost.run.outcome import RecoverableFailure, RunResult, ending_lines, failure_summary, halted, recoverable
from rlboost.run.plan import check_memory, check_rollout_architecture
from rlboost.run.report import write_report
from rlboost.run.supervisor import Supervisor
from rlboost.run.terminal import DRIVER_LOG, StepProgress, StopSignal, driver_output, say
from rlboost.run.trackers import check_trackers, open_trackers
from rlboost.trainer.feed import TaskFeed, task_feed
from rlboost.trainer.loop import train_streaming
from rlboost.trainer.starting_weights import prepare_checkpoint


def preflight(config: RunConfig) -> None:
    """Checks that need the environment, not just the config, before anything starts:
    ConfigError (or FileNotFoundError) naming the field or file."""
    check_memory(config)  # from the config alone: refused before any GPU is looked for
    check_rollout_architecture(config)
    if join_address(config.cluster.address):  # from the config or the environment
        check_multi_node(config)  # its GPUs are checked once joined
    else:  # the GPUs first: a machine without them cannot run the engine its package brings
        _check_local_machine(config)
    if capacity_kind(config) == "trace":
        plan_trace(config, config.run.steps, step_s=1.0)  # reads the trace file: a bad one is refused here
    check_trackers(config.run.trackers)
    if capacity_kind(config) == "live" and config.cluster.initial_preemptible:
        raise ConfigError("cluster.initial_preemptible places preemptible instances itself; with live capacity the "
                          "Ray cluster's preemptible nodes do: set it to 0, or cluster.capacity=trace")
    if config.model.source == "path":
        try:
            verify_checkpoint_dir(Path(config.model.path).expanduser())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.path: {exc}") from None


def _check_local_machine(config: RunConfig) -> None:
    """ConfigError naming the GPUs the run needs (and the engine's package too, when it is
    missing as well), or ModuleNotFoundError for the package alone."""
    try:
        check_local(gpu_needs(config), local_gpus())
    except ConfigError as gpus:
        try:
            check_installed(config.rollout)
        except ModuleNotFoundError as package:
            raise ConfigError(f"{gpus}; it also needs: {package}") from None
        raise
    check_installed(config.rollout)


def train(config: RunConfig, *, resume: str | None = None, echo: Callable[[str], None] = say,
          quiet: bool = True, on_start: Callable[[], None] = lambda: None) -> RunResult:
    """Run (or resume) a training run. Expected failures of a started run raise RunFailed
    (RunInterrupted for a second Ctrl-C), naming the step and the checkpoint to resume
    from; a new run that ends before its first step leaves no run directory behind.
    quiet: what Ray and native code print goes to the run directory's driver.log.
    on_start: called once everything is checked, as the run's first process starts (what
    fails before it is bad input; after it, the run's own failure)."""
    preflight(config)  # refused before anything starts
    run, first = open_run(config, resume, echo)
    trackers = stop = None
    try:
        launch = prepare_launch(config, run, first)
        trackers = open_trackers(config.run.trackers, run.path, run.read_config(), wandb_mode=config.run.wandb_mode)
        run.on_metrics(trackers.log_step)
        on_start()
        try:
            with driver_output(run.path / DRIVER_LOG, enabled=quiet) as terminal, \
                    StopSignal(terminal, last_words=lambda: _interrupted_lines(run, new=resume is None)) as stop:
                done = supervise(config, run, launch, terminal, stop)
        finally:
            if run.metrics():  # what the run did so far: plots and summary, even when it failed
                write_report(run, echo=config.run.progress)
            if trackers is not None:
                trackers.finish(run.plots_dir)
    except BaseException as exc:
        if resume is None and not run.metrics():  # nothing done: no run directory left behind
            shutil.rmtree(run.path, ignore_errors=True)
            raise
        run.drop_unfinished_checkpoints()  # a save the stop cut short; checkpoints/ itself when none was made
        if isinstance(exc, KeyboardInterrupt):
            # A stop-now press that lands outside a step (the run's processes closing, its
            # report being written) still ends with the step and the command that continues.
            raise halted(RunInterrupted, "interrupted", run, run.step, last_checkpoint_step(run)) from None
        raise
    finally:
        if stop is not None:
            stop.disarm()  # the command prints its own last lines from here
    return RunResult(run, done, stopped=done < config.run.steps)


def _interrupted_lines(run: RunDirectory, new: bool = False) -> list[str]:
    """What a run stopped at once says when its processes take too long to close (the
    process exits next: a new run without a finished step is removed, an empty checkpoints/
    too). It runs beside the main thread, which may be writing or replacing a checkpoint
    that moment: a checkpoint that cannot be read then still leaves the resume command."""
    try:
        if new and not RunDirectory.has_metrics(run.path):
            shutil.rmtree(run.path, ignore_errors=True)
            return [f"rlboost train: interrupted in step {run.step}",
                    "no step finished, so its run directory was removed; start the run again with the same command"]
        run.drop_unfinished_checkpoints(staging=False)
        return ending_lines(halted(RunInterrupted, "interrupted", run, run.step, last_checkpoint_step(run)))
    except (OSError, RlboostError):
        return [f"rlboost train: interrupted in step {run.step}",
                f"continue from its newest complete checkpoint with: rlboost train --resume {run.path}"]


def supervise(config: RunConfig, run: RunDirectory, launch: Launch, terminal: TextIO, stop: StopSignal) -> int:
    """Train the run's steps; when the controller or a trainer rank dies or a step fails,
    go back to the last checkpoint and launch again (at most run.max_restarts times).
    Returns the last step done."""
    supervisor = Supervisor(run, config.run.max_restarts, seed=config.run.seed)
    while True:
        try:
            return run_steps(config, run, launch, terminal, stop)
        except RecoverableFailure as failure:
            if stop.requested:  # the user is stopping the run: no relaunch
                raise
            restart = supervisor.restart(failure, launch.ledger)
            print(restart.line, file=terminal, flush=True)
            launch = prepare_launch(config, run, restart.first, carried=restart.ledger, billed_from=restart.at_s)


@dataclass(frozen=True, slots=True)
class Launch:
    """What one launch of a run starts from: its first step, the checkpoint state it resumes
    (empty for a new run), the starting and reference weights, the prompts, the trace plan
    and the cost ledger carried over from earlier launches; billed_from: when the reserved
    cluster's billing resumes (a restart: the failure, since the reserved machines are held
    through the relaunch), None for when the launch starts it."""

    first: int
    state: dict
    start: Path
    weights: Path
    optimizer_state: str | None
    feed: TaskFeed
    plan: TracePlan
    ledger: CostLedger
    billed_from: float | None = None


def prepare_launch(config: RunConfig, run: RunDirectory, first: int, carried: dict | None = None,
                   billed_from: float | None = None) -> Launch:
    """Everything before any process starts; a bad model, tokenizer or dataset is ConfigError.
    carried: the cost totals of the launches before this one (default: the checkpoint's)."""
    state = checkpoint_state(run, first)
    try:
        start = prepare_checkpoint(config.model, config.task).resolve()  # built and cached once
        feed = task_feed(config.task, start)
        if config.environment.multi_turn and (tool := environment_kind(config.environment).tool_call):
            feed.stop_also_at(tool.stop_token_ids(feed.tokenizer))  # a turn also ends at a tool call
    except (ValueError, OSError, ModuleNotFoundError) as exc:
        raise ConfigError(str(exc)) from exc
    weights, optimizer_state = resume_weights(run, start, first)
    ledger = CostLedger(config.cost)
    ledger.carry(state.get("ledger", {}) if carried is None else carried)  # costs of earlier launches
    return Launch(first, state, start, weights, optimizer_state, feed,
                  plan_trace(config, config.run.steps - first + 1, step_s=1.0), ledger, billed_from)


def run_steps(config: RunConfig, run: RunDirectory, launch: Launch, terminal: TextIO, stop: StopSignal) -> int:
    """Start the run's processes and train its steps; returns the last step done."""
    step = done = launch.first - 1
    with RaySession(ray_settings(config, launch.plan, worker_dir=str(run.path))):
        cluster = progress = None
        failed = True  # until the steps are done: close what is left without waiting on it
        try:
            cluster = Cluster(config, run, launch.ledger, weights=launch.weights, reference=launch.start,
                              optimizer_state=launch.optimizer_state, billed_from=launch.billed_from,
                              say=lambda line: print(line, file=terminal, flush=True))
            if cluster.environments is not None:
                launch.feed.episodes = cluster  # each step's episodes open on the environment host
            progress = StepProgress(launch.first, config.run.steps, config.run.progress, file=terminal)
            # resumed: the capacity (a trace) goes on from where the checkpoint left it
            cluster.begin(version=launch.first, resume=launch.state.get("trace"))
            for step in range(launch.first, config.run.steps + 1):
                record = train_step(cluster, launch.feed, step, config)
                run.append_metrics(record)
                progress.update(record)
                cluster.after_step(step, record["step_wall_s"])  # a trace is paced by the first step
                if step % config.run.checkpoint_every == 0 or step == config.run.steps or stop.requested:
                    save_checkpoint(cluster, run, step, launch.start)
                done = step
                if stop.requested:
                    break
            failed = False
        except KeyboardInterrupt:
            raise halted(RunInterrupted, "interrupted", run, max(step, done + 1), last_checkpoint_step(run)) from None
        except Exception as exc:
            failure = launch_failure(exc, cluster, run, max(step, done + 1))
            if failure is exc:
                raise  # a bug: its traceback says where
            raise failure from exc
        finally:
            if progress is not None:
                progress.close()
            if cluster is not None:
                cluster.close(failed=failed)
            launch.feed.close()  # the reward workers of this launch
    return done


def launch_failure(exc: Exception, cluster: Cluster | None, run: RunDirectory, step: int) -> Exception:
    """The RunFailed that an exception of a started launch stands for: RecoverableFailure when
    the driver may restart the run for it; `exc` itself when it is a bug."""
    headline = recoverable(exc, cluster.dead_processes() if cluster is not None else [], step)
    if headline is not None:
        return halted(RecoverableFailure, headline, run, step, last_checkpoint_step(run))
    summary = failure_summary(exc)
    return exc if summary is None else halted(RunFailed, summary, run, step, last_checkpoint_step(run))


def train_step(cluster: Cluster, feed: TaskFeed, step: int, config: RunConfig) -> dict:
    """One step with weight version `step`; publishes version step + 1. With bounded
    staleness (controller.max_staleness N >= 1) up to N later steps are in rollout too (their
    prompts take free slots once this step's are all placed), and the next one becomes the
    running step as soon as this step's last micro-batch is taken."""
    phases = Phases()
    staleness = config.controller.max_staleness
    with phases("pull"):  # the reserved engines load the version this step samples from
        cluster.wait_for_weights(step)
    with phases("rollout"):  # the local window: reserved engines roll out, then hand over
        if step in cluster.started_ahead:
            cluster.join_reserved(step)
        else:
            cluster.start_rollout(step, feed.groups(step))
        for later in range(step + 1, min(step + staleness, config.run.steps) + 1):  # N steps in flight
            if later not in cluster.started_ahead:  # the same prompts, in the same order, as a strict run's
                cluster.start_rollout(later, feed.groups(later), ahead=True)
        cluster.wait_window_closed()
    ended = []

    def end_early() -> None:  # the next step's rollout becomes the running one while this trains
        ended.append(cluster.end_rollout())
    with phases("train"):  # micro-batches of complete groups, as they arrive
        outcome = train_streaming(
            cluster.trainer, cluster.next_microbatch, feed.score, version=step,
            group_size=config.task.group_size, pad_id=feed.tokenizer.pad_id, grpo=config.grpo,
            timeout_s=config.run.microbatch_timeout_s, max_staleness=staleness,
            on_last=end_early if staleness and step < config.run.steps else None)
    rollout = ended[0] if ended else cluster.end_rollout()
    with phases("publish"):  # gathered bucket by bucket into the staging area, then served
        published = cluster.publish(step + 1)
    pulls = cluster.fleet.pull_records(step)
    return step_record(step, outcome, rollout, phases, pulls, published, cluster.fleet.up(),
                       cluster.ledger, cluster.run.elapsed(),
                       {**feed.describe(outcome.example), **feed.step_metrics(step)})
