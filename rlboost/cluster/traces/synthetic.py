"""Seeded synthetic availability traces whose preemptions come in clusters (storms), for
demos, emulation and simulation."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from rlboost.cluster.traces.availability import AvailabilityTrace


@dataclass(kw_only=True, slots=True)
class SyntheticTraceConfig:
    """A seeded trace with clustered preemptions.

    Preemption storms arrive as a Poisson process (mean gap mean_storm_interval_s); each
    instance up at a storm is hit with probability storm_fraction, and the victims go
    within storm_spread_s of each other (real traces show same-zone interruptions within
    minutes of each other far more often than chance). Each lost instance comes back after
    an exponential delay (mean_recovery_s). tick_s > 0 samples the count every tick_s
    seconds, as polled traces do.
    """

    duration_s: float = 6 * 3600.0
    capacity: int = 8
    initial: int | None = None
    mean_storm_interval_s: float = 3600.0
    storm_fraction: float = 0.5
    storm_spread_s: float = 180.0
    mean_recovery_s: float = 1800.0
    tick_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("duration_s", "mean_storm_interval_s", "mean_recovery_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.initial is not None and not 0 <= self.initial <= self.capacity:
            raise ValueError(f"initial must be in [0, capacity={self.capacity}], got {self.initial}")
        if not 0.0 < self.storm_fraction <= 1.0:
            raise ValueError(f"storm_fraction must be in (0, 1], got {self.storm_fraction}")
        if self.storm_spread_s < 0 or self.tick_s < 0:
            raise ValueError("storm_spread_s and tick_s must be >= 0")


def synthetic_trace(config: SyntheticTraceConfig) -> AvailabilityTrace:
    """Simulate the storms and recoveries of config; the same seed gives the same trace."""
    rng = random.Random(config.seed)
    up = config.capacity if config.initial is None else config.initial
    # Instances missing at the start come back like any preempted one.
    heap = [(rng.expovariate(1 / config.mean_recovery_s), 1, "return")
            for _ in range(config.capacity - up)]
    heap.append((rng.expovariate(1 / config.mean_storm_interval_s), 0, "storm"))
    heapq.heapify(heap)
    steps, doomed = [(0.0, up)], 0
    while heap and heap[0][0] < config.duration_s:
        t, _, kind = heapq.heappop(heap)
        if kind == "storm":
            victims = sum(rng.random() < config.storm_fraction for _ in range(up - doomed))
            doomed += victims
            for _ in range(victims):
                heapq.heappush(heap, (t + rng.uniform(0, config.storm_spread_s), 2, "loss"))
            heapq.heappush(heap, (t + rng.expovariate(1 / config.mean_storm_interval_s), 0, "storm"))
        elif kind == "loss":
            up, doomed = up - 1, doomed - 1
            heapq.heappush(heap, (t + rng.expovariate(1 / config.mean_recovery_s), 1, "return"))
        else:
            up += 1
        steps.append((t, up))
    name = f"synthetic-seed{config.seed}"
    if config.tick_s > 0:
        exact = AvailabilityTrace.from_steps(steps, config.duration_s)
        ticks = int(config.duration_s // config.tick_s)
        return AvailabilityTrace.from_ticks([exact.count_at(i * config.tick_s) for i in range(ticks)],
                                            config.tick_s, name)
    return AvailabilityTrace.from_steps(steps, config.duration_s, name)
