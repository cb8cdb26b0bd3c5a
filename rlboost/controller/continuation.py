"""Where a sample taken off its instance resumes: from its own last collected token (rlboost),
or, as the published reference does, with each group trimmed to its shortest member (its
longer members regenerate what they had beyond that point).

The reference continues a whole group as one request, so its shortest member is the shortest
of all its sub-responses, finished ones included (PolyRL utils.rs: `used` is the minimum
output length over the group); a member that finished early sets the point every moved
member of its group resumes from.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

CONTINUATIONS = ("token", "trim_group")
MIGRATIONS = ("continue", "recompute")


def from_prompt(kind: str, *, seeding: bool, migration: str) -> bool:
    """Whether samples evacuated from an instance of `kind` restart from their prompt: the
    reserved ones' at the window's close without seeding, a drained preemptible one's with
    migration="recompute" (ControllerConfig.seeding and .migration).

    >>> from_prompt("reserved", seeding=False, migration="continue"), from_prompt("preemptible", seeding=False,
    ...                                                                            migration="continue")
    (True, False)
    """
    return not seeding if kind == "reserved" else migration == "recompute"


def resume_points(progress: Mapping[int, int], group_of: Callable[[int], int], mode: str,
                  finished: Mapping[int, int] | None = None) -> dict[int, int]:
    """Tokens each moved sample keeps, from the tokens it holds (`progress`, sample -> tokens);
    `finished` (group -> shortest length of its finished members) lowers a group's point in
    trim_group mode.

    >>> moved = {10: 5, 11: 9, 20: 4}
    >>> resume_points(moved, lambda sid: sid // 10, "token")
    {10: 5, 11: 9, 20: 4}
    >>> resume_points(moved, lambda sid: sid // 10, "trim_group")
    {10: 5, 11: 5, 20: 4}
    >>> resume_points(moved, lambda sid: sid // 10, "trim_group", finished={1: 3})
    {10: 3, 11: 3, 20: 4}
    """
    if mode not in CONTINUATIONS:
        raise ValueError(f"continuation must be one of {CONTINUATIONS}, got {mode!r}")
    if mode == "token":
        return dict(progress)
    shortest: dict[int, int] = {}
    for sid, n in progress.items():
        g = group_of(sid)
        shortest[g] = min(n, shortest.get(g, n), (finished or {}).get(g, n))
    return {sid: shortest[group_of(sid)] for sid in progress}


class Trimmable(Protocol):
    """A step's samples as trim_resumed reads and cuts them (controller.collector.Collector,
    and the simulator's counted one)."""

    def progress(self, sid: int) -> int: ...

    def group_id(self, sid: int) -> int: ...

    def finished_shortest(self, sids) -> dict[int, int]: ...

    def trim(self, sid: int, keep: int) -> int: ...


def trim_resumed(col: Trimmable, sids: Sequence[int], mode: str) -> int:
    """Cut resumed samples back to where the continuation resumes them, before they start
    again; returns the tokens dropped (none in token mode)."""
    if mode == "token":
        return 0
    held = {s: col.progress(s) for s in sids if col.progress(s) > 0}
    if not held:
        return 0
    keep = resume_points(held, col.group_id, mode, col.finished_shortest(held))
    return sum(col.trim(s, n) for s, n in keep.items() if n < held[s])
