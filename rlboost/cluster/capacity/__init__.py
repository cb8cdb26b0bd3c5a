"""Where a run's preemptible instances come from: one small interface (CapacitySource) and
one class per source, chosen by `cluster.capacity` as engines are by their backend:

- trace (trace.py): a replayed availability trace, for demos, emulation and simulation;
- live (live.py): the Ray cluster's own `preemptible` nodes as they join, leave or die,
  the autoscaler asked for the run's target, and each node's preemption notices.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from rlboost.cluster.capacity.nodes import InstanceSlot
from rlboost.cluster.config import CAPACITY_KINDS, ClusterConfig
from rlboost.errors import ConfigError

__all__ = ["CAPACITY_KINDS", "CapacitySource", "InstanceSlot", "build_capacity", "resolve_kind"]


class CapacitySource(Protocol):
    """The fleet's preemptible capacity over a run."""

    name: str

    def start(self, resume: dict | None = None) -> None:
        """Begin, once the first weight version is served (resume: what position() saved)."""

    def after_step(self, step: int, step_s: float, steps_left: int) -> None:
        """A step is done (a trace is paced by the first one)."""

    def check(self) -> None:
        """Raise the source's own failure, if it had one (RuntimeError)."""

    def position(self) -> dict | None:
        """What a checkpoint keeps to resume the source where it stands (None: nothing)."""

    def stop(self) -> None:
        """Stop placing and preempting, and give back what was asked for; idempotent."""


def resolve_kind(configured: str, joined: bool) -> str:
    """`auto` is live on a Ray cluster the run joins, trace on a local one. ConfigError for
    live on a local cluster: no node of it ever joins or leaves."""
    if configured == "auto":
        return "live" if joined else "trace"
    if configured == "live" and not joined:
        raise ConfigError("cluster.capacity=live follows the preemptible nodes of a Ray cluster the run joins; "
                          "set cluster.address (or RLBOOST_RAY_ADDRESS), or use cluster.capacity=trace here")
    return configured


def build_capacity(kind: str, config: ClusterConfig, fleet: Any, *, slot: InstanceSlot,
                   record: Callable[..., None], say: Callable[[str], None], time_scale: float = 1.0) -> CapacitySource:
    """The source named kind (trace or live; resolve `auto` first) over the fleet; a trace's
    seconds are time_scale of the run's (an emulated cluster)."""
    from rlboost.cluster.capacity.live import LiveCapacity
    from rlboost.cluster.capacity.trace import TraceCapacity

    sources = {"trace": TraceCapacity, "live": LiveCapacity}
    if kind not in sources:
        raise ValueError(f"cluster.capacity must be one of {tuple(sources)} once resolved, got {kind!r}")
    extra = {"time_scale": time_scale} if kind == "trace" else {}
    return sources[kind](config, fleet, slot=slot, record=record, say=say, **extra)
