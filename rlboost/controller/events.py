"""The controller's instance events: every step of an instance's life, in the order the
controller saw it, numbered so that a listener in another process (the driver's fleet)
takes them in order and never twice. The registry emits them; the driver appends them to
events.jsonl, bills from them and waits on them, instead of asking the controller what
changed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rlboost.validate import check_format_version

EVENT_FORMAT_VERSION = 1
# The lifecycle an instance goes through, as events.jsonl records it; "loaded" (a weight
# version reported, or an instance leaving or entering the routable pool) only tells the
# driver what its waits are for.
LIFECYCLE = ("join", "active", "first_sample", "notice", "drained", "death", "gone")
EVENT_KINDS = LIFECYCLE + ("loaded",)
KEPT = 100_000  # events held for listeners that fall behind; older ones are dropped


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceEvent:
    """One event of one instance.

    >>> e = InstanceEvent(seq=4, kind="notice", instance_id="spot-0", pool="preemptible", at_s=12.5,
    ...                   preemptible_up=1, reserved_up=1, details={"grace_s": 30.0, "source": "trace"})
    >>> e.kind, e.details["grace_s"]
    ('notice', 30.0)

    seq numbers the controller's events from 1; at_s is the controller's clock. The counts
    are the instances of each pool placed and not yet ended after the event (starting and
    draining ones included). details: what the event says besides (source, reason, cause,
    grace_s, samples, samples_resumed, pid, node, weight_version, state).
    """

    seq: int
    kind: str
    instance_id: str
    pool: str
    at_s: float
    preemptible_up: int
    reserved_up: int
    details: dict[str, Any] = field(default_factory=dict)
    format_version: int = EVENT_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, EVENT_FORMAT_VERSION)
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind must be one of {EVENT_KINDS}, got {self.kind!r}")
        if self.seq < 1:
            raise ValueError(f"seq must be >= 1, got {self.seq}")


class EventLog:
    """The ordered events, and the waits of listeners on the next ones.

    append() may be called with or without a running event loop (the simulator's
    registry has listeners of its own, or none); after() wakes on the loop it runs on.
    """

    def __init__(self, kept: int = KEPT):
        self._events: deque[InstanceEvent] = deque(maxlen=kept)
        self._seq = 0
        self._changed: asyncio.Event | None = None

    @property
    def last_seq(self) -> int:
        return self._seq

    def append(self, kind: str, instance_id: str, pool: str, at_s: float, counts: tuple[int, int],
               **details: Any) -> InstanceEvent:
        self._seq += 1
        event = InstanceEvent(seq=self._seq, kind=kind, instance_id=instance_id, pool=pool, at_s=at_s,
                              preemptible_up=counts[0], reserved_up=counts[1], details=details)
        self._events.append(event)
        if self._changed is not None:
            self._changed.set()
        return event

    def since(self, seq: int) -> list[InstanceEvent]:
        """The events after `seq` still held, oldest first."""
        if not self._events or self._events[-1].seq <= seq:
            return []
        first = self._events[0].seq
        return list(self._events)[max(0, seq + 1 - first):]

    async def after(self, seq: int, timeout_s: float) -> list[InstanceEvent]:
        """The events after `seq`, as soon as there is one; [] after timeout_s (real seconds)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        while not (events := self.since(seq)):
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
            except asyncio.TimeoutError:
                return []
        return events
