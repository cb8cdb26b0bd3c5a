"""What the user sees while a run runs: rlboost's own lines and the progress bar on the
terminal, everything else the run's processes print in driver.log, and Ctrl-C handling.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO


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
        # A signal handler runs between any two bytecodes, possibly inside the progress bar's own
        # write to this stream; a buffered write from here would be reentrant, so write the raw fd.
        stream = self._terminal or sys.stderr
        try:
            os.write(stream.fileno(), b"\nstopping after this step (checkpoint, then exit); Ctrl-C again to stop now\n")
        except (OSError, ValueError, AttributeError):
            pass

    def __exit__(self, *exc) -> None:
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
            f"offload={rec['offload_share']:.0%} pull={rec['weight_pull_s']:.2f}s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
