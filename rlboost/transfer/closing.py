"""Closing: context-manager and finalizer behaviour shared by the publisher and the puller,
whose native servers and threads must stop even when a caller forgets close()."""

from __future__ import annotations

from typing import Self


class Closing:
    """Mixin for classes with an idempotent close(): ``with obj:`` closes on exit, and
    garbage collection closes too."""

    __slots__ = ()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter teardown: native objects may already be gone
            pass
