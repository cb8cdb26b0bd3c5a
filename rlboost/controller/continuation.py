"""Where a sample taken off its instance resumes: from its own last collected token (rlboost),
or, as the published reference does, with each group trimmed to the shortest of its members
that move together (its longer members regenerate what they had beyond that point).
"""

from __future__ import annotations

from typing import Callable, Mapping

CONTINUATIONS = ("token", "trim_group")


def resume_points(progress: Mapping[int, int], group_of: Callable[[int], int], mode: str) -> dict[int, int]:
    """Tokens each moved sample keeps, from the tokens it holds (`progress`, sample -> tokens).

    >>> moved = {10: 5, 11: 9, 20: 4}
    >>> resume_points(moved, lambda sid: sid // 10, "token")
    {10: 5, 11: 9, 20: 4}
    >>> resume_points(moved, lambda sid: sid // 10, "trim_group")
    {10: 5, 11: 5, 20: 4}
    """
    if mode not in CONTINUATIONS:
        raise ValueError(f"continuation must be one of {CONTINUATIONS}, got {mode!r}")
    if mode == "token":
        return dict(progress)
    shortest: dict[int, int] = {}
    for sid, n in progress.items():
        g = group_of(sid)
        shortest[g] = min(n, shortest.get(g, n))
    return {sid: shortest[group_of(sid)] for sid in progress}
