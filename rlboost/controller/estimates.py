"""Measured quantities the router and the offload policy decide from: decode rates and lengths.

RateModel learns one instance's speed from the tokens it delivers; LengthModel learns the
response-length distribution, so the work left in a half-finished sample can be predicted.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class RateModel:
    """Decode speed of one instance: each of k samples advances at min(per_sample, aggregate / k).

    >>> m = RateModel(per_sample=50.0, aggregate=1000.0)
    >>> m.rate_at(40), m.full_rate(64)
    (25.0, 1000.0)

    Observations are pooled over min_window_s of sample-time before they move the estimate,
    so a few tokens per poll do not make it jump.
    """

    def __init__(self, per_sample: float, aggregate: float, *, alpha: float = 0.3, min_window_s: float = 1.0):
        if not (per_sample > 0 and aggregate > 0):
            raise ValueError(f"rates must be > 0, got per_sample={per_sample}, aggregate={aggregate}")
        self.per_sample = float(per_sample)
        self.aggregate = float(aggregate)
        self.alpha = alpha
        self.min_window_s = min_window_s
        self.observed = False
        self._tokens = 0.0
        self._seconds = 0.0
        self._sample_seconds = 0.0

    def rate_at(self, k: int) -> float:
        """Tokens/s of one sample when k samples share the instance."""
        return min(self.per_sample, self.aggregate / max(1, k))

    def full_rate(self, capacity: int) -> float:
        """Aggregate tokens/s with capacity samples running."""
        return min(self.per_sample * capacity, self.aggregate)

    def observe(self, tokens: int, seconds: float, running: int) -> None:
        """Tokens the instance delivered over seconds while running samples were on it."""
        if seconds <= 0 or running <= 0:
            return
        self._tokens += tokens
        self._seconds += seconds
        self._sample_seconds += seconds * running
        if self._seconds < self.min_window_s:
            return
        per_sample = self._tokens / self._sample_seconds
        k = self._sample_seconds / self._seconds
        self._tokens = self._seconds = self._sample_seconds = 0.0
        a = self.alpha
        if self.per_sample <= self.aggregate / k:
            self.per_sample += a * (per_sample - self.per_sample)
        else:
            self.aggregate += a * (per_sample * k - self.aggregate)
        # the bound that was not binding may still be proven too low
        if per_sample > self.per_sample:
            self.per_sample += a * (per_sample - self.per_sample)
        if per_sample * k > self.aggregate:
            self.aggregate += a * (per_sample * k - self.aggregate)
        self.observed = True


class LengthModel:
    """Response lengths of finished samples (a sliding window), for expected remaining work.

    >>> m = LengthModel(min_count=2)
    >>> for n in (10, 20, 30, 40):
    ...     m.observe(n)
    >>> m.expected_remaining(15, max_new=100)
    15.0
    """

    def __init__(self, *, window: int = 4096, min_count: int = 8, prior_mean: float = 256.0):
        self._lengths: deque[int] = deque(maxlen=window)
        self.min_count = min_count
        self.prior_mean = prior_mean
        self._sorted: np.ndarray | None = None
        self._suffix: np.ndarray | None = None

    def observe(self, length: int) -> None:
        self._lengths.append(int(length))
        self._sorted = None

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def mean(self) -> float:
        return float(np.mean(self._lengths)) if self._lengths else self.prior_mean

    def _tables(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sorted is None:
            self._sorted = np.sort(np.fromiter(self._lengths, dtype=np.float64, count=len(self._lengths)))
            self._suffix = np.concatenate([np.cumsum(self._sorted[::-1])[::-1], [0.0]])
        return self._sorted, self._suffix

    def expected_remaining(self, progress: int, max_new: int) -> float:
        """Expected tokens still to come for a sample that has produced `progress` tokens."""
        cap = float(max(0, max_new - progress))
        if len(self._lengths) == 0:
            return min(cap, max(1.0, self.prior_mean - progress, self.prior_mean / 2))
        lengths, suffix = self._tables()
        i = int(np.searchsorted(lengths, progress, side="right"))
        longer = len(lengths) - i
        if longer >= self.min_count:
            return min(cap, float(suffix[i]) / longer - progress)
        # past what the window has seen: assume as much again as a typical sample (heavy tail)
        return min(cap, max(1.0, float(lengths.mean())))

    def expected_remaining_total(self, progress: np.ndarray, max_new: np.ndarray) -> float:
        """Sum of expected_remaining over many samples, vectorized."""
        progress = np.asarray(progress, dtype=np.float64)
        cap = np.maximum(0.0, np.asarray(max_new, dtype=np.float64) - progress)
        if progress.size == 0:
            return 0.0
        if len(self._lengths) == 0:
            guess = np.maximum(np.maximum(1.0, self.prior_mean - progress), self.prior_mean / 2)
            return float(np.minimum(cap, guess).sum())
        lengths, suffix = self._tables()
        i = np.searchsorted(lengths, progress, side="right")
        longer = len(lengths) - i
        enough = longer >= self.min_count
        conditional = suffix[i] / np.maximum(longer, 1) - progress
        guess = np.where(enough, conditional, max(1.0, float(lengths.mean())))
        return float(np.minimum(cap, guess).sum())
