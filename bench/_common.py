"""Helpers shared by the bench/ scripts: pre-faulted buffers, timing, child processes, output.

Every figure a bench prints is measured on buffers that were faulted in before the clock
starts (first touch of fresh memory runs ~0.55 GB/s on small VMs and would dominate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import mmap
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import xxhash

MiB = 1 << 20
GiB = 1 << 30
_PATTERN_BLOCK = MiB


# --------------------------------------------------------------------------- buffers
def alloc_prefaulted(nbytes: int) -> np.ndarray:
    """A writable uint8 array whose pages are resident before it is returned.

    MAP_POPULATE faults the whole mapping in one kernel call, about 6x faster here
    than touching every page from Python.
    """
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    region = mmap.mmap(-1, max(nbytes, 1), flags=flags)
    array = np.frombuffer(region, dtype=np.uint8)[:nbytes]
    if not hasattr(mmap, "MAP_POPULATE"):
        array[:: mmap.PAGESIZE] = 0
    return array


def fill_pattern(buf: np.ndarray, seed: int = 0) -> None:
    """Fill buf with deterministic pseudo-random bytes (the same for every process)."""
    block = np.random.default_rng(seed).integers(0, 256, _PATTERN_BLOCK, dtype=np.uint8)
    whole = len(buf) // _PATTERN_BLOCK
    if whole:
        np.copyto(buf[: whole * _PATTERN_BLOCK].reshape(whole, _PATTERN_BLOCK), block)
    tail = len(buf) - whole * _PATTERN_BLOCK
    buf[whole * _PATTERN_BLOCK :] = block[:tail]


class SharedPayload:
    """The benchmark payload, written once into a /dev/shm file that every process maps.

    Every peer then sends from the same physical bytes, and a child needs no time or
    memory of its own to build them.
    """

    def __init__(self, nbytes: int, seed: int):
        self.nbytes = nbytes
        self.path = f"/dev/shm/rlboost-bench-{os.getpid()}-{seed}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self.array = _map_shared(fd, nbytes)
        finally:
            os.close(fd)
        fill_pattern(self.array, seed)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> SharedPayload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map_shared(fd: int, nbytes: int) -> np.ndarray:
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(fd, nbytes, flags=flags), dtype=np.uint8)


def open_payload(path: str, nbytes: int) -> np.ndarray:
    """Map the first nbytes of a SharedPayload (pages already resident) in this process."""
    fd = os.open(path, os.O_RDWR)
    try:
        return _map_shared(fd, nbytes)
    finally:
        os.close(fd)


def digest(buf: np.ndarray) -> str:
    """Content hash used to check that a measured transfer moved the right bytes."""
    return xxhash.xxh3_64_hexdigest(memoryview(buf))


# --------------------------------------------------------------------------- timing
@dataclasses.dataclass(slots=True)
class Schedule:
    """Which payload sizes to move and how often (warm-up runs are not reported)."""

    sizes: tuple[int, ...]
    repeats: int = 3
    warmup: int = 1

    def runs(self) -> int:
        return self.warmup + self.repeats


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / 1e9 / seconds


def time_runs(fn: Callable[[], Any], schedule: Schedule) -> list[float]:
    """Call fn warmup + repeats times; return the reported (post warm-up) durations."""
    out = []
    for i in range(schedule.runs()):
        t0 = time.perf_counter()
        fn()
        if i >= schedule.warmup:
            out.append(time.perf_counter() - t0)
    return out


@dataclasses.dataclass(slots=True)
class Row:
    """One measured (peer, payload) cell; bandwidths in GB/s (1e9 bytes per second)."""

    key: str  # short name used in the JSON line, e.g. "socket"
    peer: str  # what the table shows
    nbytes: int
    seconds: list[float]
    note: str = ""
    cpu_seconds: float | None = None  # both ends, summed over the reported runs

    @property
    def cpu_per_gb(self) -> float | None:
        """CPU seconds both ends spent per GB moved: unlike GB/s, not skewed by other
        processes' load on a shared machine."""
        if self.cpu_seconds is None:
            return None
        return self.cpu_seconds / (self.nbytes * len(self.seconds) / 1e9)

    @property
    def best(self) -> float:
        return gbps(self.nbytes, min(self.seconds))

    @property
    def median(self) -> float:
        return gbps(self.nbytes, statistics.median(self.seconds))


@dataclasses.dataclass(slots=True)
class Missing:
    """A peer that could not be measured in this run, and why."""

    peer: str
    reason: str


class WrongBytes(RuntimeError):
    """A measured transfer delivered bytes that differ from the payload."""


Expect = dict[int, str]  # payload size -> digest of the payload's first `size` bytes


def check(peer: str, got: str, expect: Expect, nbytes: int) -> None:
    if got != expect[nbytes]:
        raise WrongBytes(f"{peer}: {nbytes} bytes arrived with the wrong content")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Session(Protocol):
    """One way of moving the payload into the shared destination, open across all runs.

    `sender_pids`: the other processes doing the work (the receiver is this process);
    None when they cannot all be named (then no CPU cost is reported).
    """

    key: str
    peer: str
    note: str
    sender_pids: tuple[int, ...] | None

    def prepare(self, nbytes: int) -> None:
        """Untimed setup before the runs of one payload size (e.g. publish it)."""

    def once(self, nbytes: int) -> float | None:
        """Move the first nbytes of the payload into the destination (timed). A session
        that must exclude a synchronisation step returns its own duration instead."""


def run_interleaved(sessions: Sequence[Session], schedule: Schedule, dst: np.ndarray,
                    expect: Expect, tolerate: tuple[type[BaseException], ...] = ()
                    ) -> tuple[list[Row], list[Missing]]:
    """Time every session on every size, alternating sessions within each repetition, so
    that a burst of load on a shared machine hits all of them alike. The destination is
    zeroed before each session's last run and checked after it. A session raising one of
    `tolerate` is reported as missing and dropped; the others go on."""
    rows: list[Row] = []
    failed: dict[str, Missing] = {}
    for n in schedule.sizes:
        times: dict[str, list[float]] = {s.key: [] for s in sessions}
        cpu: dict[str, float] = {s.key: 0.0 for s in sessions}
        for i in range(schedule.runs()):
            last = i == schedule.runs() - 1
            for s in sessions:
                if s.key in failed:
                    continue
                if last:
                    dst[:n] = 0
                pids = _pids(s)
                try:
                    if i == 0:
                        s.prepare(n)
                    c0 = sum(map(cpu_seconds, pids))
                    t0 = time.perf_counter()
                    own = s.once(n)
                    took = time.perf_counter() - t0 if own is None else own
                    cpu[s.key] += sum(map(cpu_seconds, pids)) - c0 if i >= schedule.warmup else 0
                except tolerate as exc:
                    traceback.print_exc(file=sys.stderr)
                    failed[s.key] = Missing(s.peer, f"failed: {str(exc).splitlines()[0][:80]}")
                    continue
                if i >= schedule.warmup:
                    times[s.key].append(took)
                if last:
                    check(s.peer, digest(dst[:n]), expect, n)
        rows += [Row(s.key, s.peer, n, times[s.key], s.note,
                     cpu[s.key] if getattr(s, "sender_pids", None) is not None else None)
                 for s in sessions if s.key not in failed]
    return rows, list(failed.values())


def _pids(session: Session) -> tuple[int, ...]:
    others = getattr(session, "sender_pids", None)
    return (os.getpid(), *others) if others is not None else ()


# --------------------------------------------------------------------------- children
class ChildFailed(RuntimeError):
    """A benchmark child process raised or died."""


def _child_entry(target: Callable, conn, env: dict[str, str], args: tuple) -> None:
    os.environ.update(env)
    try:
        target(conn, *args)
    except BaseException:  # report everything, the parent decides
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


class Child:
    """A spawned process that talks to the parent over a pipe of (kind, payload) tuples."""

    def __init__(self, target: Callable, *args: Any, env: dict[str, str] | None = None):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.name = getattr(target, "__name__", "child")
        self.proc = ctx.Process(
            target=_child_entry, args=(target, child_conn, env or {}, args), daemon=True
        )
        self.proc.start()
        child_conn.close()

    def send(self, kind: str, payload: Any = None) -> None:
        self.conn.send((kind, payload))

    def expect(self, kind: str, timeout: float = 120.0) -> Any:
        """Wait for a message of this kind; raise ChildFailed on error, death or timeout."""
        if not self.conn.poll(timeout):
            raise ChildFailed(f"{self.name}: no {kind!r} within {timeout:.0f} s")
        try:
            got, payload = self.conn.recv()
        except EOFError:
            raise ChildFailed(f"{self.name}: exited with {self.proc.exitcode}") from None
        if got == "error":
            raise ChildFailed(f"{self.name} failed:\n{payload}")
        if got != kind:
            raise ChildFailed(f"{self.name}: expected {kind!r}, got {got!r}")
        return payload

    def close(self, timeout: float = 10.0) -> None:
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout)
        self.conn.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(timeout=10.0 if exc[0] is None else 1.0)


def wait_command(conn, timeout: float = 300.0) -> tuple[str, Any]:
    """Child side: the next (kind, payload) from the parent; stop if the parent is gone."""
    if not conn.poll(timeout):
        raise TimeoutError(f"no command from the parent within {timeout:.0f} s")
    return conn.recv()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- output
def fmt_size(nbytes: int, compact: bool = False) -> str:
    """'256 MiB' for tables, '256MiB' (compact) for JSON keys."""
    sep = "" if compact else " "
    if nbytes % GiB == 0:
        return f"{nbytes // GiB}{sep}GiB"
    return f"{nbytes // MiB}{sep}MiB" if nbytes % MiB == 0 else f"{nbytes}{sep}B"


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": MiB, "G": GiB}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def hardware_tag() -> str:
    """Short machine name for results files, e.g. 'x86_64-2c-24g'."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{platform.machine()}-{os.cpu_count()}c-{round(mem / GiB)}g"


def today() -> str:
    return datetime.date.today().isoformat()


def render_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Print a table to the terminal with rich and return it as markdown."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=120).print(table)
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(["---"] * len(header)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def emit_json(metric: str, value: float | None, unit: str, ceiling: float | None,
              peers: dict[str, Any]) -> str:
    """Print the one machine-readable line every bench ends with; return it."""
    line = json.dumps(
        {"metric": metric, "value": value, "unit": unit, "ceiling": ceiling, "peers": peers}
    )
    print(line, flush=True)
    return line
