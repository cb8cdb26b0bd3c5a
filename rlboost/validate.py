"""The one check that config dataclasses use in __post_init__: a ValueError naming the
field, what it must be, and what it got."""

from __future__ import annotations


def require(ok: bool, field: str, allowed: str, got: object) -> None:
    """Raise ValueError(f"{field} must be {allowed}, got {got!r}") unless ok.

    >>> require(3 > 0, "steps", "> 0", 3)
    """
    if not ok:
        raise ValueError(f"{field} must be {allowed}, got {got!r}")


def check_format_version(record: object, expected: int) -> None:
    """ValueError unless a versioned record (anything that crosses a process or machine) is
    of the format this release reads."""
    got = getattr(record, "format_version", None)
    if got != expected:
        raise ValueError(f"{type(record).__name__}.format_version is {got!r}, this release reads {expected}: "
                         "the record comes from another release of rlboost")
