"""A run's directory over its launches: opening a new one or the one a resume continues,
reading its config back, and writing and reading its checkpoints (the driver's part; the
trainer ranks write the model and optimizer).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

import torch

from rlboost import env
from rlboost.config.overrides import from_dict, to_dict
from rlboost.config.run import RunConfig
from rlboost.errors import ConfigError
from rlboost.inputs import printable, read_json
from rlboost.run.directory import CONFIG_FILE, RunDirectory
from rlboost.trainer.checkpoint import (
    COMPLETE_MARKER,
    MODEL_DIR,
    OPTIMIZER_FILE,
    STATE_FILE,
    choose_resume_point,
    file_sizes,
    read_state,
)


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
    run = RunDirectory(Path(resume).resolve())  # workers are handed absolute paths
    run.metrics(), run.events()  # damaged lines are refused before anything is said or changed
    if point.step >= config.run.steps:
        raise ConfigError(f"{resume} has trained {point.step} steps (checkpoint {point.path.name}) and run.steps is "
                          f"{config.run.steps}: nothing is left to train; to train on, raise run.steps past "
                          f"{point.step}: --set run.steps={point.step + config.run.steps}")
    for why in point.skipped:
        echo(f"skipped {why}")
    echo(f"resuming {resume} from checkpoint {point.path.name} (step {point.step + 1} of {config.run.steps} next)")
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
        data = read_json(file)
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ValueError("expected an object of config sections, each an object")
        return from_dict(RunConfig, data)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # damaged, or not what rlboost writes
        raise ConfigError(f"{file} cannot be read back: {printable(exc)}") from None


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
