"""The ticket of a handoff between processes: where a drained batch waits for its
destination. It crosses through the coordinator (the controller), so it lives apart from the
sender and receiver: unpickling it loads no torch, no engine and no weight server.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.migration.result import HANDOFF_FORMAT_VERSION, check_mode
from rlboost.transfer.config import parse_address
from rlboost.validate import check_format_version

DEFAULT_TIMEOUT_S = 60.0  # how long a destination waits for a ticket's bytes by default
# The calls of the handoff protocol (migration/endpoint.py), which a controller makes with
# tickets on the instances that own the two ends.
HANDOFF_METHODS = ("handoff_send", "handoff_receive", "handoff_release", "handoff_take_back")


@dataclass(frozen=True, kw_only=True, slots=True)
class HandoffTicket:
    """Where a drained batch waits for its destination; the source hands it to whoever
    tells the destination (a controller), so it crosses processes.

    >>> HandoffTicket(address="127.0.0.1:41000", key=3, nbytes=8192, mode="kv", sample_ids=(7, 9),
    ...               drain_s=0.002, pack_s=0.001, publish_s=0.001).key
    3
    """

    address: str
    key: int
    nbytes: int
    mode: str
    sample_ids: tuple[int, ...]
    drain_s: float
    pack_s: float
    publish_s: float
    format_version: int = HANDOFF_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, HANDOFF_FORMAT_VERSION)
        check_mode(self.mode)
        parse_address(self.address)
        if self.key < 0 or self.nbytes < 1:
            raise ValueError(f"key must be >= 0 and nbytes >= 1, got key={self.key}, nbytes={self.nbytes}")
