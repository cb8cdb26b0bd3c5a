"""The Ray cluster's preemptible nodes as a live run sees them: read from ray.nodes(), and
how many instances each holds. Plain functions of plain data, so they are tested apart."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from rlboost.cluster.notices.base import NOTICE_SOURCES, SOURCE_LABEL


@dataclass(frozen=True, slots=True)
class InstanceSlot:
    """What one rollout instance takes of a node: a `preemptible` unit, and its CPUs and GPUs.

    >>> InstanceSlot(cpus=0.0, gpus=2.0).bundle()
    {'preemptible': 1.0, 'GPU': 2.0}
    """

    cpus: float = 0.0
    gpus: float = 0.0

    def bundle(self) -> dict[str, float]:
        """The resources of one instance, as the autoscaler's request names them."""
        out = {"preemptible": 1.0}
        if self.cpus > 0:
            out["CPU"] = float(self.cpus)
        if self.gpus > 0:
            out["GPU"] = float(self.gpus)
        return out


@dataclass(frozen=True, slots=True)
class PreemptibleNode:
    """An alive Ray node with the `preemptible` resource (and not `reserved`).

    >>> PreemptibleNode("ab12", {"preemptible": 2.0, "CPU": 8.0, "GPU": 4.0}).slots(InstanceSlot(gpus=2.0))
    2
    """

    node_id: str
    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)

    def slots(self, slot: InstanceSlot) -> int:
        """How many instances fit: one per `preemptible` unit, as far as its CPUs and GPUs go."""
        fits = [math.floor(self.resources.get("preemptible", 0.0) + 1e-9)]
        for name, need in (("CPU", slot.cpus), ("GPU", slot.gpus)):
            if need > 0:
                fits.append(math.floor(self.resources.get(name, 0.0) / need + 1e-9))
        return max(0, min(fits))

    def notice_source(self, default: str) -> str:
        """The node's label SOURCE_LABEL when it names a source, else the run's setting."""
        named = self.labels.get(SOURCE_LABEL)
        return named if named in NOTICE_SOURCES else default

    @property
    def short(self) -> str:
        return self.node_id[:6]


def preemptible_nodes(nodes: Iterable[Mapping]) -> list[PreemptibleNode]:
    """The alive preemptible nodes of a ray.nodes() answer, in id order."""
    out = []
    for n in nodes:
        resources = n.get("Resources") or {}
        if n.get("Alive") and resources.get("preemptible", 0) > 0 and resources.get("reserved", 0) <= 0:
            out.append(PreemptibleNode(str(n["NodeID"]), dict(resources), dict(n.get("Labels") or {})))
    return sorted(out, key=lambda node: node.node_id)
