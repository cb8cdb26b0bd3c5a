"""Helpers for tests that start `rlboost train` (or Ray nodes) as child processes and kill
some of their processes: found from the run's own records or from the child's process tree
(Linux /proc), and never a process outside the tree the test started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(probe: Callable[[], T], timeout: float, what: str, proc: subprocess.Popen | None = None) -> T:
    """Poll probe() until it returns something truthy (returned); AssertionError naming
    `what` after timeout seconds, or at once when proc (the run) has exited meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.1)


def _parents() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # ended meanwhile
                continue
            out[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])  # the name may hold spaces
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below pid."""
    parents, found, todo = _parents(), [], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        found += kids
        todo += kids
    return found


def name_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def kill_below(root: int, pids: list[int]) -> None:
    """SIGKILL each pid, after checking that it descends from root (a process this test
    started), so a reused pid or another user's process is never touched."""
    mine = set(descendants(root))
    strangers = [p for p in pids if p not in mine]
    assert not strangers, f"{strangers} are not processes of the run under pid {root}"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def started_at(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), None once it has ended: with the
    pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def kill_leftovers(processes: dict[int, int | None]) -> None:
    """SIGKILL the processes of a snapshot {pid: started_at(pid)} taken while they were
    this test's descendants, that still run (the same processes: same start times)."""
    for pid, start in processes.items():
        if start is not None and started_at(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def rlboost(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """`rlboost train ARGS` as a user runs it, its output captured (cwd outside the source
    tree: the installed package is imported)."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "rlboost.cli", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for the run to end; kill it (and what it started) if it has not by then."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_below(os.getpid(), [*descendants(proc.pid), proc.pid])
        out, err = proc.communicate()
        raise AssertionError(f"the run did not end within {timeout} s:\n{err[-3000:]}") from None
    return proc.returncode, out, err
