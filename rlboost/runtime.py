"""Run-level helpers of `rlboost train`: opening or resuming a run directory, checkpoints,
Ctrl-C handling, phase timing, the progress bar and the per-step metrics record.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

import torch

from rlboost import env
from rlboost.cluster.cost import CostLedger
from rlboost.cluster.instance import PullRecord
from rlboost.controller.metrics import StepMetrics
from rlboost.errors import ConfigError
from rlboost.recipes.config import RunConfig
from rlboost.recipes.overrides import from_dict, to_dict
from rlboost.rundir import CONFIG_FILE, RunDirectory
from rlboost.trainer.checkpoint import (COMPLETE_MARKER, MODEL_DIR, OPTIMIZER_FILE, STATE_FILE, choose_resume_point,
                                        file_sizes, read_state)
from rlboost.trainer.loop import StepOutcome


# -- run directory and checkpoints ----------------------------------------------------------

def run_name(config: RunConfig) -> str:
    """The run directory's name: the run's name and, unless it says so already, its
    rollout backend (so an emulated run is never mistaken for a real one)."""
    name, backend = config.run.name, config.rollout.backend
    return name if backend in name.split("-") else f"{name}-{backend}"


def open_run(config: RunConfig, resume: str | None, echo: Callable[[str], None]) -> tuple[RunDirectory, int]:
    """A new run directory (config.json written) or the one to resume; returns the first
    step. A resume says which checkpoint it continues from and why it passed over newer
    ones; CheckpointError (before anything is changed) when none can be resumed."""
    if resume is None:
        run = RunDirectory.create(env.run_root(), run_name(config))
        run.write_config(to_dict(config))
        run.record_launch("start", first_step=1)
        random.seed(config.run.seed)
        torch.manual_seed(config.run.seed)
        return run, 1
    point = choose_resume_point(Path(resume) / "checkpoints")
    if point.step >= config.run.steps:
        raise ConfigError(f"{resume} has finished its {config.run.steps} steps (checkpoint {point.path.name}); "
                          f"to train on, raise run.steps: --set run.steps={point.step + config.run.steps}")
    for why in point.skipped:
        echo(f"skipped {why}")
    echo(f"resuming {resume} from checkpoint {point.path.name} (step {point.step + 1} of {config.run.steps} next)")
    run = RunDirectory(Path(resume).resolve())  # workers are handed absolute paths
    saved = read_state(point.path)
    run.truncate_metrics(point.step)  # what came after the checkpoint is redone
    run.truncate_events(float(saved["elapsed_s"]))
    run.continue_clock(float(saved["elapsed_s"]))
    run.write_config(to_dict(config))
    run.record_launch("resume", first_step=point.step + 1)
    return run, point.step + 1


def read_run_config(path: str) -> RunConfig:
    """The config a run directory was started with (ConfigError if it is none)."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ConfigError(f"{path} is not a run directory (no {CONFIG_FILE})")
    try:
        return from_dict(RunConfig, json.loads(file.read_text()))
    except ValueError as exc:
        raise ConfigError(f"{file} cannot be read back: {exc}") from None


def last_checkpoint_step(run: RunDirectory) -> int | None:
    """The step of the run's newest complete checkpoint, or None (no resume possible)."""
    try:
        return choose_resume_point(run.path / "checkpoints").step
    except ConfigError:
        return None


def checkpoint_state(run: RunDirectory, first_step: int) -> dict:
    """The state.json of the checkpoint a resumed run starts from ({} for a new run); the
    driver's random state is restored from it."""
    if first_step == 1:
        return {}
    state = read_state(run.checkpoint_dir(first_step - 1))
    random.setstate(_tuplify(state["python_rng"]))
    return state


def resume_weights(run: RunDirectory, start: Path, first_step: int) -> tuple[Path, str | None]:
    """(model directory, optimizer state file or None) to start the trainer from; the ranks
    restore their random state from the files beside the optimizer's."""
    if first_step == 1:
        return start, None
    ckpt = run.checkpoint_dir(first_step - 1)
    return ckpt / MODEL_DIR, str(ckpt / OPTIMIZER_FILE)


def save_checkpoint(cluster: Any, run: RunDirectory, step: int, tokenizer_dir: Path) -> Path:
    """Model, optimizer, step, random state (the driver's here, each trainer rank's in its
    rng_rank{r}.pt), the cost ledger's totals, the trace's position (so a resumed run's
    costs and preemptions continue from here) and the size of every file (so a damaged
    checkpoint is caught before a resume starts). Written into a staging folder, flushed to
    disk, marked COMPLETE and renamed into place: a crash at any point leaves no half
    checkpoint under the name a resume reads."""
    staging = run.staging_dir(step)
    cluster.save_checkpoint(staging, tokenizer_dir)
    now = run.elapsed()
    state = {"step": step, "weight_version": step + 1, "elapsed_s": now, "python_rng": random.getstate(),
             "ledger": cluster.ledger.totals(at_s=now), "trace": cluster.trace_position(),
             "files": file_sizes(staging)}
    (staging / STATE_FILE).write_text(json.dumps(state))
    (staging / COMPLETE_MARKER).write_text("")
    return run.commit_checkpoint(step)


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def say(line: str) -> None:
    """A line for the user on stderr (stdout carries only what scripts read: the run path)."""
    print(line, file=sys.stderr, flush=True)


DRIVER_LOG = "driver.log"


@contextmanager
def driver_output(log: Path, enabled: bool = True) -> Iterator[TextIO]:
    """While the run's processes live, send whatever this process writes to its stdout and
    stderr (Ray's notices of dead workers, native logs) to `log`; yield a stream to the
    terminal's stderr for the run's own lines (progress, Ctrl-C notes). enabled=False
    (--debug) leaves both streams alone and yields sys.stderr."""
    if not enabled:
        yield sys.stderr
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    terminal = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    with open(log, "ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield terminal
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            terminal.close()


# -- Ctrl-C ---------------------------------------------------------------------------------

class StopSignal:
    """First Ctrl-C: finish the current step, checkpoint, stop. Second: stop at once."""

    def __init__(self, terminal: TextIO | None = None) -> None:
        self.requested = False
        self._previous = None
        self._terminal = terminal

    def __enter__(self) -> StopSignal:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: Ctrl-C keeps its default meaning
            self._previous = None
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nstopping after this step (checkpoint, then exit); Ctrl-C again to stop now",
              file=self._terminal or sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


# -- timing, progress and the metrics record ------------------------------------------------

class Phases:
    """Wall time per named phase of one step: `with phases("train"): ...`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    @property
    def total(self) -> float:
        return time.perf_counter() - self._t0


def step_record(step: int, outcome: StepOutcome, rollout: StepMetrics, phases: Phases,
                pulls: list[PullRecord], publish: dict, instances_up: int, ledger: CostLedger,
                elapsed_s: float, example: dict) -> dict:
    """One line of metrics.jsonl."""
    rec = {k: v for k, v in dataclasses.asdict(rollout).items() if k != "format_version"}
    rec["tokens_per_instance"] = dict(rollout.tokens_per_instance)
    phase = dict(phases.seconds)
    phase["wait"] = outcome.wait_s  # trainer idle, waiting for groups still being generated
    phase["train"] = max(0.0, phase.get("train", 0.0) - outcome.wait_s)
    cost = ledger.summary(at_s=elapsed_s)
    rec.update({
        "step": step, "reward_mean": outcome.reward_mean, "reward_std": _std(outcome.rewards),
        "tokens_per_s": rollout.total_tokens / rollout.rollout_time_s if rollout.rollout_time_s > 0 else 0.0,
        "instances_up": instances_up,
        "weight_pull_s": max((p.pull_s for p in pulls), default=0.0),
        "weight_load_s": max((p.load_s for p in pulls), default=0.0),
        "weight_peer_bytes": sum(p.peer_bytes for p in pulls), "pulls": len(pulls),
        "publish_bytes": publish.get("bytes", 0), "samples_trained": outcome.samples,
        "samples_unique": outcome.unique_samples, "sample_versions": sorted(outcome.versions),
        "microbatches": outcome.microbatches,
        "response_tokens": outcome.denominator, **outcome.train,
        "step_wall_s": phases.total, "elapsed_s": elapsed_s,
        "cost_usd": cost.total_usd, "reserved_usd": cost.reserved_usd, "tokens_billed": cost.tokens,
    })
    rec.update({f"phase_{k}_s": v for k, v in phase.items()})
    rec.update(example)
    return rec


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


class StepProgress:
    """A tqdm bar over steps with reward, tokens/s, instances up, offload share and pull time."""

    def __init__(self, first: int, last: int, enabled: bool, file: TextIO | None = None):
        from tqdm import tqdm

        self.bar = tqdm(total=last, initial=first - 1, desc="train", unit="step", disable=not enabled,
                        dynamic_ncols=True, file=file)

    def update(self, rec: dict) -> None:
        self.bar.set_postfix_str(
            f"reward={rec['reward_mean']:.3f} tok/s={rec['tokens_per_s']:.0f} up={rec['instances_up']} "
            f"offload={rec['offload_share']:.0%} pull={rec['weight_pull_s']:.2f}s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
