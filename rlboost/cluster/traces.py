"""Spot-instance availability traces and the preemption events a cluster driver replays.

Traces in public formats are read by trace_readers into one step function of instance
count over time (availability.AvailabilityTrace); this module generates seeded synthetic
traces whose preemptions come in clusters, and turns count changes into join / notice /
kill events.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from rlboost.cluster.availability import AvailabilityTrace
from rlboost.cluster.trace_readers import (
    MEASURED,
    READERS,
    SAMPLE_TRACE,
    SAMPLES,
    load_trace,
    read_bamboo_csv,
    read_count_csv,
    read_skypilot_json,
    read_spotserve_csv,
    read_spotserve_segment,
    sample_trace,
)
from rlboost.validate import check_format_version

__all__ = ["EVENT_KINDS", "MEASURED", "READERS", "SAMPLES", "SAMPLE_TRACE", "AvailabilityTrace", "InstanceEvent",
           "PreemptionPolicy", "SyntheticTraceConfig", "load_trace", "preemption_events", "read_bamboo_csv",
           "read_count_csv", "read_skypilot_json", "read_spotserve_csv", "read_spotserve_segment",
           "sample_trace", "synthetic_trace"]

EVENT_FORMAT_VERSION = 1
EVENT_KINDS = ("join", "notice", "kill")
VICTIM_ORDERS = ("oldest", "newest", "random")
SUDDEN_PATTERNS = ("spread", "random")


# ---- synthetic traces ------------------------------------------------------------------

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


# ---- preemption events -----------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceEvent:
    """One action of the cluster driver on one preemptible instance.

    >>> InstanceEvent(time_s=40.0, instance_id="spot-3", kind="notice", deadline_s=42.0)
    InstanceEvent(time_s=40.0, instance_id='spot-3', kind='notice', deadline_s=42.0, format_version=1)

    "join": the instance becomes available. "notice": it will be reclaimed at deadline_s
    (drain and migrate now). "kill": it is gone; deadline_s is None for a sudden kill
    that no notice announced, and the announced deadline (== time_s) otherwise.
    """

    time_s: float
    instance_id: str
    kind: str
    deadline_s: float | None = None
    format_version: int = EVENT_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, EVENT_FORMAT_VERSION)
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind must be one of {EVENT_KINDS}, got {self.kind!r}")
        if self.kind == "notice" and (self.deadline_s is None or self.deadline_s < self.time_s):
            raise ValueError("a notice needs deadline_s >= time_s")

    @property
    def sudden(self) -> bool:
        return self.kind == "kill" and self.deadline_s is None


@dataclass(kw_only=True, slots=True)
class PreemptionPolicy:
    """How count drops become concrete preemptions.

    victim_order picks who goes ("oldest" first, "newest" first, "random"). notice_s is
    the warning before a reclaim, in the trace's (possibly scaled) seconds: AWS gives
    120 s, GCP 30 s. A share sudden_fraction of preemptions get no notice, either evenly
    spread ("spread": with 0.5, every second one) or drawn at random with seed.
    """

    victim_order: str = "oldest"
    notice_s: float = 120.0
    sudden_fraction: float = 0.0
    sudden_pattern: str = "spread"
    seed: int = 0
    id_prefix: str = "spot-"

    def __post_init__(self) -> None:
        if self.victim_order not in VICTIM_ORDERS:
            raise ValueError(f"victim_order must be one of {VICTIM_ORDERS}, got {self.victim_order!r}")
        if not self.notice_s >= 0:
            raise ValueError(f"notice_s must be >= 0, got {self.notice_s}")
        if not 0.0 <= self.sudden_fraction <= 1.0:
            raise ValueError(f"sudden_fraction must be in [0, 1], got {self.sudden_fraction}")
        if self.sudden_pattern not in SUDDEN_PATTERNS:
            raise ValueError(f"sudden_pattern must be one of {SUDDEN_PATTERNS}, "
                             f"got {self.sudden_pattern!r}")


def preemption_events(trace: AvailabilityTrace,
                      policy: PreemptionPolicy | None = None) -> tuple[InstanceEvent, ...]:
    """Join, notice and kill events that reproduce the trace, sorted by time.

    Instances present at time 0 join at 0. A notice never precedes its victim's join;
    when the join leaves no room for a warning, the kill is sudden.
    """
    policy = policy or PreemptionPolicy()
    rng = random.Random(policy.seed)
    alive: list[tuple[str, float]] = []  # (instance id, join time), oldest first
    events: list[InstanceEvent] = []
    next_id = preemptions = 0
    for t, before, after in [(0.0, 0, trace.counts[0])] + trace.changes():
        for _ in range(after - before):
            alive.append((f"{policy.id_prefix}{next_id}", t))
            events.append(InstanceEvent(time_s=t, instance_id=alive[-1][0], kind="join"))
            next_id += 1
        for victim, joined in _pick_victims(alive, before - after, policy.victim_order, rng):
            alive.remove((victim, joined))
            warned_at = max(t - policy.notice_s, joined)
            if _is_sudden(preemptions, policy, rng) or warned_at >= t:
                events.append(InstanceEvent(time_s=t, instance_id=victim, kind="kill"))
            else:
                events.append(InstanceEvent(time_s=warned_at, instance_id=victim, kind="notice",
                                            deadline_s=t))
                events.append(InstanceEvent(time_s=t, instance_id=victim, kind="kill", deadline_s=t))
            preemptions += 1
    # One instant never both adds and removes (one count change per time), but a clamped
    # notice can share its victim's join instant: the join goes first.
    order = {"join": 0, "notice": 1, "kill": 2}
    return tuple(sorted(events, key=lambda e: (e.time_s, order[e.kind])))


def _pick_victims(alive, n, order, rng) -> list[tuple[str, float]]:
    if n <= 0:
        return []
    if order == "oldest":
        return alive[:n]
    if order == "newest":
        return alive[::-1][:n]
    return rng.sample(alive, n)


def _is_sudden(index: int, policy: PreemptionPolicy, rng: random.Random) -> bool:
    f = policy.sudden_fraction
    if policy.sudden_pattern == "random":
        return rng.random() < f
    return int((index + 1) * f) > int(index * f)
