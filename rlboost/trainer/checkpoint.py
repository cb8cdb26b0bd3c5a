"""A run's checkpoints on disk: which one a resume continues from, and whether its files
are whole. Checked before any process starts, so a damaged checkpoint is one clear line
rather than a failure inside a trainer rank minutes later.

A checkpoint folder `step_N` holds the model (`model/`, safetensors), `optimizer.pt`, every
rank's random state, `state.json` (with the size of every other file) and a `COMPLETE`
marker written last.
"""

from __future__ import annotations

import math
import random
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from rlboost.errors import CheckpointError
from rlboost.inputs import inside, printable, read_json
from rlboost.models.checkpoint import verify_checkpoint_dir
from rlboost.trainer import rng

STATE_FILE = "state.json"
COMPLETE_MARKER = "COMPLETE"
OPTIMIZER_FILE = "optimizer.pt"
MODEL_DIR = "model"


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """The checkpoint a resumed run continues from, and why newer ones were passed over."""

    step: int
    path: Path
    skipped: tuple[str, ...] = ()


def file_sizes(folder: Path) -> dict[str, int]:
    """The size of every file of a checkpoint folder but its state file and marker, by
    path relative to the folder (recorded in state.json at save time)."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (STATE_FILE, COMPLETE_MARKER)}


def read_state(folder: Path) -> dict:
    """The checkpoint's state.json (CheckpointError when it is missing, damaged, or holds
    values of other types than rlboost writes)."""
    path = folder / STATE_FILE
    try:
        state = read_json(path, max_bytes=16 << 20)
    except FileNotFoundError:
        raise CheckpointError(f"{folder} has no {STATE_FILE}") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged ({printable(exc)})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{path} is not a checkpoint state")
    problem = _state_problem(state)
    if problem:
        raise CheckpointError(f"{path} is damaged: {problem}")
    return state


def _state_problem(state: dict) -> str | None:
    """What in a state.json is not as save_checkpoint writes it, or None."""
    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    step, files, trace = state.get("step"), state.get("files") or {}, state.get("trace")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step must be an integer >= 0, got {printable(repr(step))[:60]}"
    if not number(state.get("elapsed_s", 0.0)):
        return "elapsed_s must be a number >= 0"
    if not isinstance(files, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in files.values()):
        return "files must map file names to sizes"
    if not isinstance(state.get("ledger", {}), dict):
        return "ledger must be an object"
    if trace is not None and not (isinstance(trace, dict) and all(number(trace.get(k, 0.0)) for k in trace)):
        return "trace must be an object of numbers"
    if state.get("python_rng") is not None:
        try:
            random.Random().setstate(_tuplify(state["python_rng"]))
        except (TypeError, ValueError, OverflowError):
            return "python_rng is not a random state"
    return None


def _tuplify(value):
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def verify(folder: Path) -> dict:
    """Check that a checkpoint's files are whole and read as rlboost writes them; return its
    state. CheckpointError names the first file that is missing, truncated or damaged, or a
    name in state.json that leads outside the folder (whose target is never looked at)."""
    state = read_state(folder)
    try:
        for rel, size in (state.get("files") or {}).items():
            path = inside(folder, rel)
            if not path.is_file():
                raise CheckpointError(f"{path} is missing")
            if path.stat().st_size != size:
                raise CheckpointError(f"{path} has {path.stat().st_size} bytes, {size} were written")
        verify_checkpoint_dir(inside(folder, MODEL_DIR, "folder"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(printable(exc)) from None
    _verify_optimizer(folder / OPTIMIZER_FILE)
    for path in sorted(folder.glob("rng_rank*.pt")):
        try:
            rng.check(torch.load(path, weights_only=True))
        except Exception as exc:  # torch.load raises anything from a damaged pickle
            raise CheckpointError(f"{path} is not a random state rlboost wrote ({_first_line(exc)})") from None
    return state


def _verify_optimizer(optimizer: Path) -> None:
    try:
        with zipfile.ZipFile(optimizer):  # torch.save's zip: its directory sits at the end
            pass
    except FileNotFoundError:
        raise CheckpointError(f"{optimizer} is missing") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{optimizer} is truncated or damaged ({exc})") from None
    try:  # mmap: the structure is read, the tensors' bytes stay on disk
        saved = torch.load(optimizer, weights_only=True, mmap=True)
    except Exception as exc:  # a damaged pickle inside a whole zip
        raise CheckpointError(f"{optimizer} is damaged ({_first_line(exc)})") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{optimizer}: expected a dict with an 'optimizer' entry, got {type(saved).__name__}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return printable(text.splitlines()[0][:200] if text else type(exc).__name__)


def choose_resume_point(checkpoints: Path) -> ResumePoint:
    """The newest complete checkpoint under `checkpoints`. One without its COMPLETE marker
    (a save that was interrupted) is passed over and named in `skipped`; one that is marked
    complete but damaged is refused, since continuing from an older one would silently
    redo steps: the error says which folder to delete to do that on purpose."""
    found = sorted(((int(p.name.split("_")[1]), p) for p in checkpoints.glob("step_*")
                    if p.name.split("_")[1].isdigit() and _stays_inside(checkpoints, p)), reverse=True)
    skipped: list[str] = []
    for i, (step, path) in enumerate(found):
        if not (path / COMPLETE_MARKER).exists():
            skipped.append(f"{path.name} has no {COMPLETE_MARKER} marker: its save was interrupted")
            continue
        try:
            verify(path)
        except CheckpointError as exc:
            older = next((p.name for _, p in found[i + 1:] if (p / COMPLETE_MARKER).exists()), None)
            way = f"delete it to resume from {older}" if older else "no older checkpoint exists"
            raise CheckpointError(f"checkpoint {path.name} is damaged: {exc}; {way}") from None
        return ResumePoint(step, path, tuple(skipped))
    why = f" ({'; '.join(skipped)})" if skipped else ""
    raise CheckpointError(f"{checkpoints.parent} has no complete checkpoint to resume from{why}")


def _stays_inside(checkpoints: Path, folder: Path) -> bool:
    """A checkpoint folder that is one (not a link to somewhere outside the run's checkpoints)."""
    try:
        return inside(checkpoints, folder.name, "folder").is_dir()
    except ValueError:
        raise CheckpointError(f"{folder} is a link to a folder outside {checkpoints}; a checkpoint stays in "
                              "its run directory") from None
