"""Records of a data set that a reader leaves out (too long, too deep, not UTF-8, not JSON,
no answer, ...), counted by cause. The first record of each cause is logged in one line
naming the file and the record; a file of which nothing is left is one ValueError line."""

from __future__ import annotations

import logging
from collections import Counter

from rlboost.inputs import printable

log = logging.getLogger("rlboost.dataset")


class Refusals:
    """Usage: refusals.refuse("line 4", "too deep", "nested deeper than 64 levels") per
    record left out; as_dict() for the run's metrics; nothing_left() for the error to raise
    when no record remains.

    >>> r = Refusals("train.jsonl")
    >>> r.refuse("line 2", "not JSON", "not JSON (Expecting value at column 1)")
    >>> r.as_dict()
    {'not JSON': 1}
    """

    def __init__(self, source: str):
        self.source = source
        self.counts: Counter[str] = Counter()
        self._first: dict[str, str] = {}  # cause -> "FILE RECORD: detail" of its first record

    def refuse(self, record: str, cause: str, detail: str) -> None:
        self.counts[cause] += 1
        if cause not in self._first:
            self._first[cause] = printable(f"{self.source} {record}: {detail}")
            log.warning("%s; such records are left out (counted in metrics.jsonl as records_refused)",
                        self._first[cause])

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts.most_common())

    def __len__(self) -> int:
        return sum(self.counts.values())

    def nothing_left(self, what: str = "records") -> ValueError:
        """The one-line error for a file that held no usable record."""
        if not self.counts:
            return ValueError(f"{printable(self.source)} holds no {what}")
        kinds = ", ".join(f"{n} {cause}" for cause, n in self.counts.most_common())
        first = self._first[self.counts.most_common(1)[0][0]]
        return ValueError(f"{printable(self.source)} holds no usable {what}: every one was refused ({kinds}); "
                          f"first: {first}")
