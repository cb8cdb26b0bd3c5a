"""Cost ledger: instance-seconds of reserved and preemptible capacity, bytes of weights that
cross into each instance pool, dollars, tokens per dollar.

Callers pass times explicitly (any one clock), so the same ledger serves live runs,
compressed trace replays (time_scale) and the simulator.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

KINDS = ("reserved", "preemptible")
GB = 1e9  # clouds bill egress per 10^9 bytes


@dataclass(kw_only=True, slots=True)
class CostConfig:
    """Prices per hour and per GB moved, and how ledger seconds map to billed seconds.

    reserved_usd_per_hour buys the whole reserved cluster (trainer ranks and the reserved
    rollout engines that share its devices); preemptible_usd_per_hour buys one preemptible
    instance. Defaults are the RLBoost artifact's cost model (Terra-Flux/PolyRL
    REPRODUCE.md) for one 8x H100 node: $83.79/h on demand, $21.28/h spot. time_scale is billed seconds per
    ledger second: 60 when one trace hour is replayed as one minute. egress_usd_per_gb prices
    the weight bytes instances of each pool pull from the trainer's publishers (bytes among
    peers of one pool stay in its zone): e.g. ``{"preemptible": 0.09}`` for spot capacity in
    another region; a pool left out costs 0.
    """

    reserved_usd_per_hour: float = 83.79
    """price of the whole reserved cluster (trainer ranks and reserved engines), $/h"""
    preemptible_usd_per_hour: float = 21.28
    """price of one preemptible instance, $/h"""
    time_scale: float = 1.0
    """billed seconds per second of the run (60: a trace hour replayed as a minute)"""
    egress_usd_per_gb: dict[str, float] = field(default_factory=lambda: {"reserved": 0.0, "preemptible": 0.0})
    """$ per GB of weights each pool's instances pull from the trainer (0: same zone; clouds list 0.01-0.12)"""

    def __post_init__(self) -> None:
        for name in ("reserved_usd_per_hour", "preemptible_usd_per_hour"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.time_scale > 0.0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        prices = self.egress_usd_per_gb
        if not isinstance(prices, dict) or set(prices) - set(KINDS) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0.0 for v in prices.values()):
            raise ValueError(f"egress_usd_per_gb must map pools {KINDS} to prices >= 0, got {prices!r}")
        self.egress_usd_per_gb = {kind: float(prices.get(kind, 0.0)) for kind in KINDS}

    def usd_per_hour(self, kind: str) -> float:
        return self.reserved_usd_per_hour if kind == "reserved" else self.preemptible_usd_per_hour


@dataclass(frozen=True, kw_only=True, slots=True)
class CostSummary:
    """Totals at one moment (billed seconds, dollars, tokens, weight bytes pulled from the
    trainer and what they cost; total_usd includes them)."""

    reserved_s: float
    preemptible_s: float
    reserved_usd: float
    preemptible_usd: float
    tokens: int
    egress_bytes: int = 0
    egress_usd: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.reserved_usd + self.preemptible_usd + self.egress_usd

    @property
    def tokens_per_dollar(self) -> float:
        return self.tokens / self.total_usd if self.total_usd > 0 else 0.0


class CostLedger:
    """Accrues instance-seconds per kind as instances start and stop; thread-safe.

    >>> ledger = CostLedger()
    >>> ledger.start("trainer-0", "reserved", at_s=0.0)
    >>> ledger.start("spot-0", "preemptible", at_s=0.0)
    >>> ledger.stop("spot-0", at_s=1800.0)
    >>> ledger.add_tokens(1_000_000)
    >>> round(ledger.summary(at_s=3600.0).total_usd, 2)  # 83.79 + 21.28 / 2
    94.43
    """

    def __init__(self, config: CostConfig | None = None):
        self.config = config or CostConfig()
        self._lock = threading.Lock()
        self._running: dict[str, tuple[str, float, str]] = {}  # id -> (kind, since, source)
        self._closed_s = {kind: 0.0 for kind in KINDS}     # ledger seconds of stopped spans
        self._by_source: dict[str, float] = {}  # ledger seconds of stopped preemptible spans, per source
        self._egress = {kind: 0 for kind in KINDS}          # bytes pulled from the trainer, per pool
        self._tokens = 0

    def start(self, instance_id: str, kind: str, *, at_s: float, source: str = "trace") -> None:
        """An instance of kind ("reserved" or "preemptible") starts billing at at_s; source:
        what placed it (a trace, the Ray cluster's nodes), counted apart for preemptible ones."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        with self._lock:
            if instance_id in self._running:
                raise ValueError(f"instance {instance_id!r} is already running")
            self._running[instance_id] = (kind, float(at_s), source)

    def stop(self, instance_id: str, *, at_s: float) -> None:
        """The instance stops billing at at_s (preempted, released or finished)."""
        with self._lock:
            if instance_id not in self._running:
                raise ValueError(f"instance {instance_id!r} is not running")
            kind, since, source = self._running[instance_id]
            if at_s < since:
                raise ValueError(f"instance {instance_id!r} stops at {at_s} before its start {since}")
            del self._running[instance_id]
            self._closed_s[kind] += at_s - since
            if kind == "preemptible":
                self._by_source[source] = self._by_source.get(source, 0.0) + at_s - since

    def add_tokens(self, n: int) -> None:
        """Count n trained (or generated, as the caller defines) tokens."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        with self._lock:
            self._tokens += n

    def add_egress(self, kind: str, nbytes: int) -> None:
        """Count nbytes of weights an instance of pool `kind` pulled from the trainer."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            self._egress[kind] += int(nbytes)

    def carry(self, totals: dict) -> None:
        """Add the totals() of a run's earlier launches (a resumed run keeps its costs)."""
        seconds, tokens = totals.get("seconds", {}), int(totals.get("tokens", 0))
        egress = totals.get("egress_bytes", {})  # absent in checkpoints from before it was counted
        by_source = totals.get("preemptible_seconds_by_source", {})  # likewise
        if (set(seconds) - set(KINDS) or set(egress) - set(KINDS) or tokens < 0 or not isinstance(by_source, dict)
                or any(float(v) < 0 for v in [*seconds.values(), *egress.values(), *by_source.values()])):
            raise ValueError(f"totals must hold seconds and egress bytes per kind in {KINDS} and tokens, all >= 0, "
                             f"got {totals!r}")
        with self._lock:
            for kind, value in seconds.items():
                self._closed_s[kind] += float(value)
            for source, value in by_source.items():
                self._by_source[str(source)] = self._by_source.get(str(source), 0.0) + float(value)
            for kind, value in egress.items():
                self._egress[kind] += int(value)
            self._tokens += tokens

    def totals(self, *, at_s: float) -> dict:
        """Ledger seconds per kind (running instances counted up to at_s), preemptible seconds
        per source, egress bytes per kind and tokens, as a JSON-ready dict that carry() takes back."""
        with self._lock:
            seconds, by_source = dict(self._closed_s), dict(self._by_source)
            for kind, since, source in self._running.values():
                seconds[kind] += max(0.0, at_s - since)
                if kind == "preemptible":
                    by_source[source] = by_source.get(source, 0.0) + max(0.0, at_s - since)
            return {"seconds": seconds, "preemptible_seconds_by_source": by_source,
                    "egress_bytes": dict(self._egress), "tokens": self._tokens}

    def running(self) -> dict[str, str]:
        """Instance id -> kind of every instance billing now."""
        with self._lock:
            return {i: kind for i, (kind, _, _) in self._running.items()}

    def summary(self, *, at_s: float) -> CostSummary:
        """Totals up to at_s, counting running instances up to that moment."""
        totals = self.totals(at_s=at_s)
        seconds, tokens = totals["seconds"], totals["tokens"]
        scale = self.config.time_scale
        billed = {kind: s * scale for kind, s in seconds.items()}
        usd = {kind: billed[kind] / 3600.0 * self.config.usd_per_hour(kind) for kind in KINDS}
        egress = totals["egress_bytes"]
        egress_usd = sum(egress[kind] / GB * self.config.egress_usd_per_gb[kind] for kind in KINDS)
        return CostSummary(reserved_s=billed["reserved"], preemptible_s=billed["preemptible"],
                           reserved_usd=usd["reserved"], preemptible_usd=usd["preemptible"],
                           tokens=tokens, egress_bytes=sum(egress.values()), egress_usd=egress_usd)

    def tokens_per_dollar(self, *, at_s: float) -> float:
        return self.summary(at_s=at_s).tokens_per_dollar
