"""Progress reporting for pulls: a callback of (bytes_done, total_bytes), and a tqdm bar
for runs a person is watching.
"""

from __future__ import annotations

from typing import Callable

ProgressCallback = Callable[[int, int], None]


class TqdmProgress:
    """A progress callback drawing a tqdm bar in bytes; closes itself when the pull ends."""

    def __init__(self, desc: str = "pull weights", **tqdm_kwargs):
        from tqdm.auto import tqdm

        self._bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, **tqdm_kwargs)

    def __call__(self, done: int, total: int) -> None:
        if self._bar.total != total:
            self._bar.reset(total=total)
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        self._bar.close()
