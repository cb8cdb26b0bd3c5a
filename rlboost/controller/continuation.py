"""Where a sample taken off its instance resumes: from its own last collected token (rlboost),
or, as the published reference does, with each group trimmed to its shortest member (its
longer members regenerate what they had beyond that point).

The reference continues a whole group as one request, so its shortest member is the shortest
of all its sub-responses, finished ones included (PolyRL utils.rs: `used` is the minimum
output length over the group); a member that finished early sets the point every moved
member of its group resumes from.
"""

from __future__ import annotations

from typing import Callable, Mapping

CONTINUATIONS = ("token", "trim_group")


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
