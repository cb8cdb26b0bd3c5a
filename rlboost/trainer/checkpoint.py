"""A run's checkpoints on disk: which one a resume continues from, and whether its files
are whole. Checked before any process starts, so a damaged checkpoint is one clear line
rather than a failure inside a trainer rank minutes later.

A checkpoint folder `step_N` holds the model (`model/`, safetensors), `optimizer.pt`, every
rank's random state, `state.json` (with the size of every other file) and a `COMPLETE`
marker written last.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlboost.errors import CheckpointError
from rlboost.models.checkpoint import verify_checkpoint_dir

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
    """The checkpoint's state.json (CheckpointError when it is missing or damaged)."""
    try:
        state = json.loads((folder / STATE_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder} has no {STATE_FILE}") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder / STATE_FILE} is damaged ({exc})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{folder / STATE_FILE} is not a checkpoint state")
    return state


def verify(folder: Path) -> dict:
    """Check that a checkpoint's files are whole; return its state. CheckpointError names
    the first file that is missing, truncated or damaged."""
    state = read_state(folder)
    for rel, size in (state.get("files") or {}).items():
        path = folder / rel
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"{path} has {path.stat().st_size} bytes, {size} were written")
    try:
        verify_checkpoint_dir(folder / MODEL_DIR)
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(exc)) from None
    optimizer = folder / OPTIMIZER_FILE
    try:
        with zipfile.ZipFile(optimizer):  # torch.save's zip: its directory sits at the end
            pass
    except FileNotFoundError:
        raise CheckpointError(f"{optimizer} is missing") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{optimizer} is truncated or damaged ({exc})") from None
    return state


def choose_resume_point(checkpoints: Path) -> ResumePoint:
    """The newest complete checkpoint under `checkpoints`. One without its COMPLETE marker
    (a save that was interrupted) is passed over and named in `skipped`; one that is marked
    complete but damaged is refused, since continuing from an older one would silently
    redo steps: the error says which folder to delete to do that on purpose."""
    found = sorted(((int(p.name.split("_")[1]), p) for p in checkpoints.glob("step_*")
                    if p.is_dir() and p.name.split("_")[1].isdigit()), reverse=True)
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
