"""AvailabilityTrace: how many preemptible instances exist over time (a step function), the
one shape every trace format is read into and every replay and simulation consumes."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    """How many preemptible instances exist over [0, duration_s).

    counts[i] holds from times_s[i] until the next time (right-continuous steps);
    times_s[0] is 0 and times strictly increase.

    >>> AvailabilityTrace((0.0, 60.0), (2, 1), 120.0).count_at(90.0)
    1
    """

    times_s: tuple[float, ...]
    counts: tuple[int, ...]
    duration_s: float
    name: str = ""

    def __post_init__(self) -> None:
        if not self.times_s or len(self.times_s) != len(self.counts):
            raise ValueError("times_s and counts must be non-empty and of one length")
        if self.times_s[0] != 0.0:
            raise ValueError(f"times_s must start at 0, got {self.times_s[0]}")
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:])):
            raise ValueError("times_s must strictly increase")
        if any(c < 0 for c in self.counts):
            raise ValueError("counts must be >= 0")
        if not self.duration_s >= self.times_s[-1]:
            raise ValueError(f"duration_s {self.duration_s} ends before the last change "
                             f"at {self.times_s[-1]}")

    @classmethod
    def from_steps(cls, steps: list[tuple[float, int]], duration_s: float | None = None,
                   name: str = "") -> AvailabilityTrace:
        """Build from (time, count) pairs in time order; count 0 before the first time,
        repeated counts merged, a later pair at an equal time wins."""
        times, counts = [0.0], [0]
        for t, c in steps:
            if t < times[-1]:
                raise ValueError(f"step times must not decrease: {t} after {times[-1]}")
            if t == times[-1]:
                counts[-1] = int(c)
            else:
                times.append(float(t))
                counts.append(int(c))
        end = times[-1] if duration_s is None else float(duration_s)
        merged_t, merged_c = [times[0]], [counts[0]]
        for t, c in zip(times[1:], counts[1:]):
            if c != merged_c[-1]:
                merged_t.append(t)
                merged_c.append(c)
        return cls(tuple(merged_t), tuple(merged_c), end, name)

    @classmethod
    def from_ticks(cls, counts: list[int], gap_s: float, name: str = "") -> AvailabilityTrace:
        """One count per tick of gap_s seconds (the SkyPilot layout)."""
        if not gap_s > 0:
            raise ValueError(f"gap_s must be > 0, got {gap_s}")
        return cls.from_steps([(i * gap_s, c) for i, c in enumerate(counts)],
                              duration_s=len(counts) * gap_s, name=name)

    def count_at(self, t: float) -> int:
        return self.counts[max(0, bisect.bisect_right(self.times_s, t) - 1)]

    @property
    def max_count(self) -> int:
        return max(self.counts)

    def changes(self) -> list[tuple[float, int, int]]:
        """(time, count before, count after) for every change of count."""
        return [(t, a, b) for t, a, b in zip(self.times_s[1:], self.counts, self.counts[1:])]

    def instance_seconds(self) -> float:
        """Integral of the count over the trace (instance-seconds available)."""
        ends = self.times_s[1:] + (self.duration_s,)
        return sum(c * (e - t) for t, e, c in zip(self.times_s, ends, self.counts))

    def scaled(self, factor: float) -> AvailabilityTrace:
        """Every time multiplied by factor (1/60 turns hours into minutes)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        return AvailabilityTrace(tuple(t * factor for t in self.times_s), self.counts,
                                 self.duration_s * factor, self.name)

    def compressed_to(self, duration_s: float) -> AvailabilityTrace:
        """The trace scaled to last duration_s seconds (a CPU demo of a day-long trace)."""
        if not duration_s > 0 or self.duration_s <= 0:
            raise ValueError(f"cannot compress a {self.duration_s} s trace to {duration_s} s")
        return self.scaled(duration_s / self.duration_s)

    def window(self, start_s: float, end_s: float) -> AvailabilityTrace:
        """The part in [start_s, end_s), shifted to start at 0."""
        if not 0 <= start_s < end_s <= self.duration_s:
            raise ValueError(f"window [{start_s}, {end_s}) is not inside [0, {self.duration_s}]")
        steps = [(0.0, self.count_at(start_s))]
        steps += [(t - start_s, c) for t, c in zip(self.times_s, self.counts) if start_s < t < end_s]
        return AvailabilityTrace.from_steps(steps, end_s - start_s, self.name)

    def capped(self, max_count: int) -> AvailabilityTrace:
        """Counts limited to max_count (a cluster smaller than the traced one)."""
        return AvailabilityTrace.from_steps(
            [(t, min(c, max_count)) for t, c in zip(self.times_s, self.counts)],
            self.duration_s, self.name)
