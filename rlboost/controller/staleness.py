"""Bounded staleness: which weight versions may produce the tokens trained at a step.

Step k is trained on top of weight version k, and publishes version k+1. With
`controller.max_staleness` N = 0 (the default) every token of step k comes from version k
(strict on-policy). With N >= 1 a token of step k may come from any version in
[k-N, k], so an instance that has no step-k work left may start step k+1's prompts on
the version it holds while the trainer trains step k, and takes k+1 when it is published.
A sample that spans an update keeps its tokens; it records where its version changed.

Pure rules, no I/O; the controller, the trainer and the simulator share them. API:

- ``accepted_versions(step, n) -> range``: the versions step `step` may train, [step-n, step]
  (clamped at 0).
- ``may_start(held, step, n) -> bool``: may an instance holding version `held` generate
  tokens for step `step`'s prompts (``held in accepted_versions(step, n)``).
- ``open_steps(published, n) -> range``: the steps whose prompts may be in rollout while the
  newest published version is `published`: published .. published+n.
- Version changes of one sample: a tuple of ``(token_index, version)`` change points, the
  first at index 0, indices strictly increasing, neighbours' versions different.
  ``extend_changes(changes, length, new_tokens, version)`` appends a run of tokens;
  ``token_versions(changes, length)`` expands it to one version per token;
  ``check_changes(changes, length)`` validates the shape (ValueError);
  ``truncate_changes(changes, keep)`` drops the change points of tokens past `keep`;
  ``check_within(changes, length, step, n, sample_id=...)`` raises StaleSampleError for
  any token outside the window.
- ``staleness_histogram(step, n, samples) -> tuple[int, ...]``: tokens at lag 0..n over
  `samples`, an iterable of ``(changes, length)``; a token outside the window raises
  StaleSampleError. ``largest_lag(histogram)``: the largest lag with a token (0 if none).
"""

from __future__ import annotations

from collections.abc import Iterable

from rlboost.errors import StaleSampleError

VersionChanges = tuple[tuple[int, int], ...]
"""(token_index, version) change points of one sample's output tokens."""

MAX_STALENESS = 8
"""Largest max_staleness controller config accepts (more is off-policy beyond what the
truncated importance weights are meant to correct)."""


def _check_bound(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_STALENESS:
        raise ValueError(f"max_staleness must be an integer from 0 to {MAX_STALENESS}, got {n!r}")


def accepted_versions(step: int, n: int) -> range:
    """Versions whose tokens step `step` may train: [step-n, step], never below version 0."""
    _check_bound(n)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return range(max(0, step - n), step + 1)


def may_start(held: int, step: int, n: int) -> bool:
    """Whether an instance holding version `held` may generate for step `step`'s prompts.

    A version newer than the step's never can (it is trained from the step's samples);
    with n = 0 only the step's own version can.
    """
    return held in accepted_versions(step, n)


def open_steps(published: int, n: int) -> range:
    """Steps whose prompts may be in rollout while `published` is the newest version:
    step `published` (strict) and, with n >= 1, up to n steps ahead of it."""
    _check_bound(n)
    if published < 0:
        raise ValueError(f"published must be >= 0, got {published}")
    return range(published, published + n + 1)


def check_changes(changes: VersionChanges, length: int) -> None:
    """Validate one sample's change points against its output length (ValueError)."""
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if not changes:
        if length:
            raise ValueError(f"{length} tokens but no version change points")
        return
    if changes[0][0] != 0:
        raise ValueError(f"the first change point must be at token 0, got {changes[0]}")
    for (i, v), (j, w) in zip(changes, changes[1:]):
        if j <= i:
            raise ValueError(f"change points must have increasing token indices: {changes}")
        if v == w:
            raise ValueError(f"neighbouring change points repeat version {v}: {changes}")
    if changes[-1][0] >= length:
        raise ValueError(f"change point {changes[-1]} is past the sample's {length} tokens")
    if any(v < 0 for _, v in changes):
        raise ValueError(f"versions must be >= 0: {changes}")


def extend_changes(changes: VersionChanges, length: int, new_tokens: int, version: int) -> VersionChanges:
    """The change points after `new_tokens` tokens from `version` follow `length` tokens."""
    if new_tokens < 0:
        raise ValueError(f"new_tokens must be >= 0, got {new_tokens}")
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    if new_tokens == 0 or (changes and changes[-1][1] == version):
        return changes
    if not changes and length:
        raise ValueError(f"{length} tokens but no version change points")
    return changes + ((length, version),)


def truncate_changes(changes: VersionChanges, keep: int) -> VersionChanges:
    """The change points of the first `keep` tokens (a trimmed sample's)."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    return tuple(c for c in changes if c[0] < keep)


def token_versions(changes: VersionChanges, length: int) -> tuple[int, ...]:
    """One version per output token."""
    check_changes(changes, length)
    out: list[int] = []
    for idx, (start, version) in enumerate(changes):
        end = changes[idx + 1][0] if idx + 1 < len(changes) else length
        out.extend([version] * (end - start))
    return tuple(out)


def _lag_tokens(changes: VersionChanges, length: int) -> Iterable[tuple[int, int]]:
    """(version, tokens) per run of the sample."""
    for idx, (start, version) in enumerate(changes):
        end = changes[idx + 1][0] if idx + 1 < len(changes) else length
        yield version, end - start


def check_within(changes: VersionChanges, length: int, step: int, n: int, *, sample_id: int) -> None:
    """Raise StaleSampleError if any token of the sample is outside step's window."""
    check_changes(changes, length)
    window = accepted_versions(step, n)
    bad = [(i, v) for i, v in changes if v not in window]
    if bad:
        raise StaleSampleError(f"sample {sample_id} has tokens from weight version(s) "
                               f"{sorted({v for _, v in bad})} (first at token {bad[0][0]}); step {step} "
                               f"accepts {window.start}..{window.stop - 1}")


def staleness_histogram(step: int, n: int, samples: Iterable[tuple[VersionChanges, int]]) -> tuple[int, ...]:
    """Output tokens at lag 0, 1, .., n (lag = step - version) over `samples`, each
    ``(changes, length)``; a token outside the window raises StaleSampleError (naming the
    sample by its position in `samples`)."""
    counts = [0] * (n + 1)
    for i, (changes, length) in enumerate(samples):
        check_within(changes, length, step, n, sample_id=i)
        for version, tokens in _lag_tokens(changes, length):
            counts[step - version] += tokens
    return tuple(counts)


def largest_lag(histogram: Iterable[int]) -> int:
    """The largest lag at which a staleness histogram holds tokens (0 when it holds none)."""
    return max((lag for lag, tokens in enumerate(histogram) if tokens), default=0)
