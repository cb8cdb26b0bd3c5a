"""A run directory: config, metrics JSONL, instance events, checkpoints, plots, summary.

Everything a run leaves behind lives under one folder so it can be inspected, plotted
again (`rlboost report RUN_DIR`) or resumed (`rlboost train --resume RUN_DIR`). Every
event line carries the run clock's time `t` and the training `step` it happened in.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from rlboost.inputs import printable, read_json, read_jsonl
from rlboost.run.partial_files import writing

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.md"
SCENARIO_FILE = "scenario.json"  # what `rlboost simulate` ran: its folder is a simulation's, not a training run's
LAUNCH_REASONS = ("start", "resume", "restart")
# what a run writes into its folder: none may be a symbolic link, or a crafted directory
# would have `report` or `--resume` write (or read) a file elsewhere
_OWN_ENTRIES = (CONFIG_FILE, METRICS_FILE, EVENTS_FILE, SUMMARY_FILE, "checkpoints", "plots", "driver.log")


class RunDirectory:
    """Owns the files of one training run; appends are flushed line by line."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for name in _OWN_ENTRIES:
            if (self.path / name).is_symlink():
                raise ValueError(f"{self.path / name} is a symbolic link: a run directory's files stay in it")
        (self.path / "checkpoints").mkdir(exist_ok=True)
        (self.path / "plots").mkdir(exist_ok=True)
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._step = self._next_step()
        self._metrics_listeners: list[Callable[[dict[str, Any]], None]] = []

    @staticmethod
    def has_metrics(path: str | os.PathLike[str]) -> bool:
        """Whether a folder holds a run's metrics of at least one step (read nothing else)."""
        metrics = Path(path) / METRICS_FILE
        return metrics.is_file() and not metrics.is_symlink() and metrics.stat().st_size > 0

    @classmethod
    def create(cls, root: str | os.PathLike[str], name: str) -> RunDirectory:
        """A new directory `name-YYYYmmdd-HHMMSS[-N]` under root. The folder is created
        exclusively, so runs started in the same second never share one."""
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a regular file, a read-only file system, no permission
            raise OSError(exc.errno, f"cannot make run directories under {root} (RLBOOST_RUN_ROOT): "
                                     f"{exc.strerror}") from None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in range(1, 10_000):
            path = Path(root) / (f"{name}-{stamp}" if suffix == 1 else f"{name}-{stamp}-{suffix}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise OSError(exc.errno, f"cannot make a run directory under {root} (RLBOOST_RUN_ROOT): "
                                         f"{exc.strerror}") from None
            return cls(path)
        raise FileExistsError(f"no free run directory name for {name}-{stamp} under {root}")

    # -- config ------------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        _atomic_write(self.path / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True))

    def read_config(self) -> dict[str, Any]:
        return read_json(self.path / CONFIG_FILE)

    # -- metrics and events --------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        """One step's line; the events recorded after it belong to the next step."""
        _append_jsonl(self.path / METRICS_FILE, record)
        with self._lock:
            self._step = int(record["step"]) + 1
        for listener in self._metrics_listeners:
            listener(record)

    def on_metrics(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call listener(record) after each metrics line is written (the run's trackers)."""
        self._metrics_listeners.append(listener)

    @property
    def step(self) -> int:
        """The step in progress (or about to start): the last step with metrics plus one."""
        return self._step

    def append_event(self, kind: str, **fields: Any) -> None:
        """One line of events.jsonl: {"t", "step", "kind", **fields} (a `step` in fields wins)."""
        with self._lock:  # several threads record instance events; t and order agree
            record = {"t": round(self.elapsed(), 3), "step": self._step, "kind": kind, **fields}
            _append_jsonl(self.path / EVENTS_FILE, record)

    def record_launch(self, reason: str, first_step: int) -> None:
        """Mark that a launch of the run begins (its processes start) and runs from
        first_step on: reason "start" (a new run), "resume" (`--resume` of this directory)
        or "restart" (the driver relaunches after a failure). Plots draw resumes and
        restarts, and begin counting that launch's instances from zero."""
        if reason not in LAUNCH_REASONS:
            raise ValueError(f"reason must be one of {LAUNCH_REASONS}, got {reason!r}")
        if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 1:
            raise ValueError(f"first_step must be an int >= 1, got {first_step!r}")
        with self._lock:
            self._step = first_step
        self.append_event("launch", reason=reason)

    def elapsed(self) -> float:
        """Seconds on the run's clock (events' t; continues across resumes)."""
        return time.monotonic() - self._t0

    def continue_clock(self, at_least_s: float = 0.0) -> None:
        """Resume the run's clock after the last recorded event (and at least at_least_s,
        a checkpoint's time), so times keep increasing."""
        last = max((float(e.get("t", 0.0)) for e in self.events()), default=at_least_s)
        last = max(last, at_least_s)
        last = max([last] + [float(m.get("elapsed_s", 0.0)) for m in self.metrics()])
        self._t0 = time.monotonic() - last

    def metrics(self) -> list[dict[str, Any]]:
        return list(_read_jsonl(self.path / METRICS_FILE))

    def events(self) -> list[dict[str, Any]]:
        return list(_read_jsonl(self.path / EVENTS_FILE))

    def truncate_metrics(self, last_step: int) -> None:
        """Drop metric lines after `last_step` (used when resuming from a checkpoint)."""
        kept = [m for m in self.metrics() if m.get("step", -1) <= last_step]
        _atomic_write(self.path / METRICS_FILE, "".join(json.dumps(m) + "\n" for m in kept))
        with self._lock:
            self._step = self._next_step()

    def _next_step(self) -> int:
        return max((int(m["step"]) for m in self.metrics() if "step" in m), default=0) + 1

    def truncate_events(self, after_s: float) -> None:
        """Drop events recorded after `after_s` on the run's clock (resuming from a
        checkpoint taken then: the steps after it are redone, their preemptions too)."""
        kept = [e for e in self.events() if float(e.get("t", 0.0)) <= after_s]
        with self._lock:
            _atomic_write(self.path / EVENTS_FILE, "".join(json.dumps(e) + "\n" for e in kept))

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint_dir(self, step: int) -> Path:
        return self.path / "checkpoints" / f"step_{step:06d}"

    def staging_dir(self, step: int) -> Path:
        """An empty folder to write checkpoint `step` into before commit_checkpoint(step)."""
        staging = self.path / "checkpoints" / f".step_{step:06d}.tmp"
        if staging.is_symlink():
            staging.unlink()
        shutil.rmtree(staging, ignore_errors=True)  # a leftover of an interrupted save
        staging.mkdir(parents=True)
        return staging

    def commit_checkpoint(self, step: int) -> Path:
        """Flush the staged checkpoint to disk and rename it into place in one step, so a
        crash leaves either the previous state or a whole checkpoint."""
        staging, final = self.path / "checkpoints" / f".step_{step:06d}.tmp", self.checkpoint_dir(step)
        _fsync_tree(staging)
        if final.exists():  # an earlier save of this step: replaced whole, never merged
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
        _fsync_dir(final.parent)
        return final

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint (one whose COMPLETE marker exists)."""
        found = []
        for child in (self.path / "checkpoints").glob("step_*"):
            if (child / "COMPLETE").exists():
                found.append((int(child.name.split("_")[1]), child))
        return max(found) if found else None

    @property
    def plots_dir(self) -> Path:
        return self.path / "plots"

    def drop_unfinished_checkpoints(self, *, staging: bool = True) -> None:
        """Remove the staging folders of saves that never finished (staging=False: a save may
        still be under way, leave them), then checkpoints/ when it holds nothing: a run that
        stopped before its first checkpoint (or a simulation) does not seem to hold one."""
        for folder in (self.path / "checkpoints").glob(".step_*.tmp") if staging else ():
            if folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder, ignore_errors=True)
        try:
            (self.path / "checkpoints").rmdir()
        except OSError:  # not empty (or gone): left as it is
            pass

    @property
    def simulated(self) -> bool:
        """Whether `rlboost simulate` wrote this folder (its summary is the simulation's own)."""
        return (self.path / SCENARIO_FILE).is_file()

    def write_summary(self, text: str) -> None:
        _atomic_write(self.path / SUMMARY_FILE, text)


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of metrics.jsonl or events.jsonl: ValueError naming the file and line for
    one that is not a JSON object with an integer step (and, for events, a numeric t and a
    kind), as rlboost writes them."""
    if not path.exists():
        return
    for number, record in read_jsonl(path):
        step, t, kind = record.get("step"), record.get("t", 0.0), record.get("kind", "")
        if path.name == EVENTS_FILE and ("t" not in record or "kind" not in record):
            raise ValueError(f"{path} line {number}: an event needs t and kind")
        if ((step is not None or path.name == METRICS_FILE) and (isinstance(step, bool) or not isinstance(step, int))
                or isinstance(t, bool) or not isinstance(t, (int, float)) or not isinstance(kind, str)):
            raise ValueError(f"{path} line {number}: step must be an integer, t a number and kind a string, "
                             f"got {printable(repr(step))[:40]}, {printable(repr(t))[:40]}, {printable(repr(kind))[:40]}")
        yield record


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file under root, then every folder (deepest first)."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(folder))


def _atomic_write(path: Path, text: str) -> None:
    """Write a new file and rename it over `path` (never through a link that a crafted
    directory may have left where the temporary file goes)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        with writing(tmp):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
    except BaseException:  # a Ctrl-C mid-write leaves the old file and no half of a new one
        tmp.unlink(missing_ok=True)
        raise
