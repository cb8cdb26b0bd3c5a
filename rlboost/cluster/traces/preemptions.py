"""Preemption events: an availability trace's count changes turned into the join / notice /
kill actions a cluster driver replays (which instance goes, and whether with a notice)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlboost.cluster.traces.availability import AvailabilityTrace
from rlboost.validate import check_format_version

EVENT_FORMAT_VERSION = 1
EVENT_KINDS = ("join", "notice", "kill")
VICTIM_ORDERS = ("oldest", "newest", "random")
SUDDEN_PATTERNS = ("spread", "random")


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
