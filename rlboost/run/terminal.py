"""What the user sees while a run runs: rlboost's own lines and the progress bar on the
terminal, everything else the run's processes print in driver.log, and Ctrl-C handling.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TextIO

from rlboost.run.partial_files import remove_unfinished


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


class StopSignal:
    """First Ctrl-C: finish the current step, checkpoint, stop. Second: stop at once; if the
    run's processes have not closed grace_s after it, print last_words() and exit 130 anyway.

    Presses are counted as they land, not in the Python handler: Python runs its handler
    only when the main thread is back in the interpreter, which inside ray.get is once a
    second, so two presses in between would run it once and the second would be lost.
    Python's wakeup fd gets one byte per signal, read here by a thread of its own."""

    def __init__(self, terminal: TextIO | None = None, *, last_words: Callable[[], list[str]] | None = None,
                 grace_s: float = 3.0) -> None:
        self.requested = False  # first press: stop after this step
        self.now = False        # second press: stop at once
        self.presses = 0
        self._terminal, self._last_words, self._grace_s = terminal, last_words, grace_s
        self._previous = None
        self._wakeup: tuple[int, int] | None = None  # (read end, the wakeup fd it replaced)
        self._raised = False
        self._lock = threading.Lock()
        self._deadline: threading.Timer | None = None

    def __enter__(self) -> StopSignal:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: Ctrl-C keeps its default meaning
            self._previous = None
            return self
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup = (read, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
        self._write_end = write
        threading.Thread(target=self._count, args=(read,), name="ctrl-c", daemon=True).start()
        return self

    def _count(self, read: int) -> None:
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data:  # __exit__ closed the write end: this thread owns the read end
                os.close(read)
                return
            for _ in range(data.count(signal.SIGINT)):
                self._press()

    def _press(self) -> None:
        with self._lock:
            self.presses += 1
            first, again = self.presses == 1, self.presses >= 2 and not self.now
            if first:
                self.requested = True
            if again:
                self.now = True
        if first:
            self._write(b"\nstopping after this step (checkpoint, then exit); Ctrl-C again to stop now\n")
        if again:
            self._write(b"\nstopping now\n")
            if self._last_words is not None:
                self._deadline = threading.Timer(self._grace_s, self._give_up)
                self._deadline.daemon = True
                self._deadline.start()
            _thread.interrupt_main(signal.SIGINT)  # the handler raises at the interpreter's next check

    def _handle(self, signum, frame) -> None:
        if self._wakeup is None:  # no counting thread: count here
            self._press_in_handler()
        if self.now and not self._raised:
            self._raised = True  # once: later presses must not break the closing of what runs
            raise KeyboardInterrupt

    def _press_in_handler(self) -> None:
        if self.requested:
            self.now = True
        else:
            self.requested = True
            self._write(b"\nstopping after this step (checkpoint, then exit); Ctrl-C again to stop now\n")

    def _give_up(self) -> None:
        """The run's processes did not close in time: say how to resume, and leave (Ray's
        own reaper ends the local cluster's processes when this one exits)."""
        try:
            lines = self._last_words() if self._last_words is not None else []
        except Exception:  # the last words are best effort; the exit is not
            lines = ["rlboost train: interrupted"]
        self._write(("\n".join(lines) + "\n").encode(errors="replace"))
        remove_unfinished()  # os._exit runs no finally: half-written files go first
        os._exit(130)

    def _write(self, data: bytes) -> None:
        # A signal (or this thread) may land inside the progress bar's own write to this
        # stream; a buffered write from here would be reentrant, so write the raw fd.
        for stream in (self._terminal, sys.stderr):
            try:
                os.write(stream.fileno(), data)
                return
            except (OSError, ValueError, AttributeError):
                continue

    def disarm(self) -> None:
        """No forced exit any more: the caller is about to print its lines and return."""
        if self._deadline is not None:
            self._deadline.cancel()

    def __exit__(self, *exc) -> None:
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._wakeup[1])
            os.close(self._write_end)  # the counting thread sees the end and closes its side
            self._wakeup = None
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class StepProgress:
    """A tqdm bar over steps with reward, tokens/s, instances up, offload share and pull time."""

    def __init__(self, first: int, last: int, enabled: bool, file: TextIO | None = None):
        from tqdm import tqdm

        self.bar = tqdm(total=last, initial=first - 1, desc="train", unit="step", disable=not enabled,
                        dynamic_ncols=True, file=file)

    def update(self, rec: dict) -> None:
        self.bar.set_postfix_str(
            f"reward={rec['reward_mean']:.3f} tok/s={rec['tokens_per_s']:.0f} up={rec['instances_up']} "
            f"offload={rec['offload_share']:.0%} pull={rec['weight_pull_s']:.2f}s{delta_note(rec)}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def delta_note(rec: dict) -> str:
    """The progress line's word on the latest delta: its size, or why it was declined.

    >>> delta_note({"publish_delta": {"declined": True, "values_changed": 0.97}})
    ' delta=declined (97% of values changed)'
    """
    d = rec.get("publish_delta") or {}
    if "target" not in d and "declined" not in d:
        return ""
    changed = d.get("values_changed")
    if d.get("declined"):
        return f" delta=declined ({changed:.0%} of values changed)" if changed is not None else " delta=declined"
    if d.get("bytes"):
        return f" delta={d['target_bytes'] / d['bytes']:.0f}x smaller"
    return ""
