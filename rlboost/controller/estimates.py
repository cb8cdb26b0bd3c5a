"""Measured quantities the router and the offload policy decide from: decode rates and lengths.

RateModel learns one instance's speed from the tokens it delivers; LengthModel learns the
response-length distribution, so the work left in a half-finished sample can be predicted.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

import numpy as np


class RateModel:
    """Decode speed of one instance: a decode step with k samples takes max(c, a + b k) seconds,
    so each sample advances at 1 / max(c, a + b k) tokens/s and the instance at k times that.

    >>> m = RateModel(per_sample=50.0, aggregate=1000.0)
    >>> round(m.rate_at(1), 3), round(m.rate_at(40), 3), round(m.full_rate(64), 1)
    (50.0, 20.202, 870.7)

    Two shapes of engine meet here. A memory-bound GPU engine pays a per step however few
    samples run (reading the weights) and b per sample (its cache, its compute): a sample
    alone decodes fast and a crowded instance slowly, with no kink. An engine with a
    per-sample cap (the emulated engines, a server's per-request limit) decodes each sample at
    most 1 / c tokens/s until the instance's ceiling 1 / b binds: a kink at k = c / b. The
    priors start from the kink (per_sample = 1 / c, aggregate = 1 / b, a a sliver of b); the
    measurements then move whichever part predicted them.

    Observations are pooled over min_window_s of sample-time before they move the estimate,
    so a few tokens per poll do not make it jump. Each moves the predicted step time at the
    observed k a share alpha of the way to the measurement: c when the floor predicted it
    (or when the measurement is below it: no sample is slower alone than in company); else a
    and b k, split as the squares of their parts of it (a normalized least-mean-squares step),
    so a crowded instance teaches mostly b and observations at several batch sizes separate
    a from b. A crowded instance therefore never teaches that a sample alone is slow.
    """

    def __init__(self, per_sample: float, aggregate: float, *, alpha: float = 0.3, min_window_s: float = 1.0):
        if not (per_sample > 0 and aggregate > 0):
            raise ValueError(f"rates must be > 0, got per_sample={per_sample}, aggregate={aggregate}")
        self.alpha = alpha
        self.min_window_s = min_window_s
        self.observed = False
        self._b = 1.0 / float(aggregate)
        # half of a lone sample's step is taken as fixed cost: the measurements decide how much
        # of it really is (a) and how much a per-sample cap (c)
        self._a = max((1.0 / float(per_sample) - self._b) / 2.0, 1e-3 * self._b)
        self._c = max(1.0 / float(per_sample), self._a + self._b)
        self._tokens = 0.0
        self._seconds = 0.0
        self._sample_seconds = 0.0

    @classmethod
    def like(cls, peers, per_sample: float, aggregate: float) -> RateModel:
        """A new instance's model: the mean of the rates measured on its peers (instances of its
        kind), or the priors while none of them has been measured."""
        measured = [r for r in peers if r.observed]
        if measured:
            per_sample = sum(r.per_sample for r in measured) / len(measured)
            aggregate = sum(r.aggregate for r in measured) / len(measured)
        return cls(per_sample, aggregate)

    @property
    def per_sample(self) -> float:
        """Tokens/s of one sample alone on the instance."""
        return 1.0 / self.step_s(1)

    @property
    def aggregate(self) -> float:
        """The instance's ceiling in tokens/s (many samples)."""
        return 1.0 / self._b

    @aggregate.setter
    def aggregate(self, value: float) -> None:
        if not value > 0:
            raise ValueError(f"aggregate must be > 0, got {value}")
        self._b = 1.0 / float(value)

    def step_s(self, k: float) -> float:
        """Seconds per token of each sample when k share the instance."""
        linear = self._a + self._b * (k if k > 1.0 else 1.0)  # (routing asks this per candidate move)
        return self._c if self._c > linear else linear

    def rate_at(self, k: int) -> float:
        """Tokens/s of one sample when k samples share the instance."""
        return 1.0 / self.step_s(k)

    def full_rate(self, capacity: int) -> float:
        """Aggregate tokens/s with capacity samples running."""
        return max(1, capacity) / self.step_s(capacity)

    def observe(self, tokens: int, seconds: float, running: int) -> None:
        """Tokens the instance delivered over seconds while running samples were on it."""
        if seconds <= 0 or running <= 0:
            return
        self._tokens += tokens
        self._seconds += seconds
        self._sample_seconds += seconds * running
        if self._seconds < self.min_window_s or self._tokens <= 0:
            return
        k = max(1.0, self._sample_seconds / self._seconds)
        measured = self._sample_seconds / self._tokens  # seconds per token of one sample
        self._tokens = self._seconds = self._sample_seconds = 0.0
        self.observed = True
        linear = self._a + self._b * k
        if self._c >= linear or measured < self._c:
            self._c += self.alpha * (measured - self._c)
            if self._c >= linear:
                return
        error = self.alpha * (measured - linear)  # > -alpha x linear
        r = self._b * k / self._a  # b k's part against a's
        self._a += error / (1.0 + r * r)
        self._b += error * r * r / (1.0 + r * r) / k


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
        self._scalar: tuple[list, list, float] | None = None  # the tables as lists, for one sample at a time

    def observe(self, length: int) -> None:
        self._lengths.append(int(length))
        self._sorted = self._scalar = None

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
        if self._scalar is None:  # routing asks per sample, many times between observations
            lengths, suffix = self._tables()
            self._scalar = (lengths.tolist(), suffix.tolist(), max(1.0, float(lengths.mean())))
        lengths, suffix, typical = self._scalar
        i = bisect_right(lengths, progress)
        longer = len(lengths) - i
        if longer >= self.min_count:
            return min(cap, suffix[i] / longer - progress)
        # past what the window has seen: assume as much again as a typical sample (heavy tail)
        return min(cap, typical)

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
