"""Files being written under a temporary name before they are renamed into place.

A forced exit (a second Ctrl-C whose run does not close in time ends with `os._exit`, which
runs no `finally`) removes them first, so a run directory never keeps half of a file."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_lock = threading.Lock()
_pending: set[Path] = set()


@contextmanager
def writing(tmp: Path) -> Iterator[Path]:
    """Marks `tmp` as a file being written until the block ends."""
    with _lock:
        _pending.add(tmp)
    try:
        yield tmp
    finally:
        with _lock:
            _pending.discard(tmp)


def remove_unfinished() -> None:
    """Deletes every file still being written (best effort: called on the way out)."""
    with _lock:
        pending = list(_pending)
    for tmp in pending:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
