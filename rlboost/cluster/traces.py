"""Spot-instance availability traces and the preemption events a cluster driver replays.

Reads SkyPilot spot-traces JSON, `time,count` CSV and SpotServe event CSV into one step
function of instance count over time; generates seeded synthetic traces whose
preemptions come in clusters; turns count changes into join / notice / kill events.
"""

from __future__ import annotations

import bisect
import csv
import heapq
import json
import random
from dataclasses import dataclass
from pathlib import Path

from rlboost.validate import check_format_version

EVENT_FORMAT_VERSION = 1
EVENT_KINDS = ("join", "notice", "kill")
VICTIM_ORDERS = ("oldest", "newest", "random")
SUDDEN_PATTERNS = ("spread", "random")
SAMPLE_TRACE = Path(__file__).with_name("data") / "spot_sample.csv"


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


# ---- readers ---------------------------------------------------------------------------

def read_skypilot_json(path: str | Path) -> AvailabilityTrace:
    """`{"metadata": {"gap_seconds": 300}, "data": [counts...]}` (skypilot-org/spot-traces)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        gap, data = float(doc["metadata"]["gap_seconds"]), doc["data"]
        counts = [int(c) for c in data]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a SkyPilot spot trace ({type(exc).__name__}: {exc})") from None
    if not counts:
        raise ValueError(f"{path}: empty data")
    return AvailabilityTrace.from_ticks(counts, gap, name=path.stem)


def _csv_rows(path: Path):
    with path.open(newline="") as f:
        for line_no, row in enumerate(csv.reader(f), 1):
            if row and not row[0].lstrip().startswith("#") and any(x.strip() for x in row):
                yield line_no, [x.strip() for x in row]


def read_count_csv(path: str | Path, duration_s: float | None = None) -> AvailabilityTrace:
    """`time,count` rows (seconds; optional header; `#` comments). The count is 0 before
    the first row; the last row's time ends the trace unless duration_s says otherwise."""
    path = Path(path)
    steps = []
    for line_no, row in _csv_rows(path):
        if not steps and row[:2] == ["time", "count"]:
            continue
        try:
            t, c = float(row[0]), int(row[1])
            if len(row) != 2 or t < 0 or c < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(f"{path} line {line_no}: expected 'time,count' with "
                             f"non-negative numbers, got {row}") from None
        steps.append((t, c))
    if not steps:
        raise ValueError(f"{path}: no rows")
    try:
        return AvailabilityTrace.from_steps(steps, duration_s, name=path.stem)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def read_spotserve_csv(path: str | Path, duration_s: float | None = None) -> AvailabilityTrace:
    """`timestamp_ms,add|remove,nodeN` events (Hsword/SpotServe trace_full); count = nodes up."""
    path = Path(path)
    alive: set[str] = set()
    steps = []
    for line_no, row in _csv_rows(path):
        if len(row) != 3 or row[1] not in ("add", "remove") or not row[0].isdigit():
            raise ValueError(f"{path} line {line_no}: expected 'timestamp_ms,add|remove,node', "
                             f"got {row}")
        t, action, node = int(row[0]) / 1000.0, row[1], row[2]
        if (action == "add") == (node in alive):
            raise ValueError(f"{path} line {line_no}: {action} of node {node!r} that is "
                             f"{'already' if node in alive else 'not'} up")
        (alive.add if action == "add" else alive.remove)(node)
        steps.append((t, len(alive)))
    if not steps:
        raise ValueError(f"{path}: no events")
    try:
        return AvailabilityTrace.from_steps(steps, duration_s, name=path.stem)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def load_trace(path: str | Path, fmt: str = "auto") -> AvailabilityTrace:
    """Read any supported format: "skypilot", "counts", "spotserve" or "auto" (by content)."""
    path = Path(path)
    if fmt == "auto":
        if path.suffix == ".json":
            fmt = "skypilot"
        else:
            first = next((row for _, row in _csv_rows(path)), [])
            fmt = "spotserve" if len(first) == 3 and first[1] in ("add", "remove") else "counts"
    readers = {"skypilot": read_skypilot_json, "counts": read_count_csv,
               "spotserve": read_spotserve_csv}
    if fmt not in readers:
        raise ValueError(f"fmt must be 'auto' or one of {tuple(readers)}, got {fmt!r}")
    return readers[fmt](path)


def sample_trace() -> AvailabilityTrace:
    """The bundled 4-hour sample (rlboost/cluster/data/spot_sample.csv, see README there)."""
    return read_count_csv(SAMPLE_TRACE)


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
