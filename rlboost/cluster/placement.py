"""Whether a run's processes fit the machines before any of them starts: GPUs for the
trainer ranks and reserved engines on reserved nodes, and for every preemptible instance
on a preemptible node. A shortfall is one ConfigError naming the numbers, in seconds,
instead of actors that wait in Ray forever (billed all the while).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable, Mapping

from rlboost.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuNeeds:
    """The GPUs a run asks for.

    >>> GpuNeeds(trainer_ranks=4, gpus_per_rank=1, reserved_engines=4, gpus_per_engine=1,
    ...          preemptible=4, gpus_per_instance=2).reserved
    8.0
    """

    trainer_ranks: int
    gpus_per_rank: float
    reserved_engines: int
    gpus_per_engine: float
    preemptible: int
    gpus_per_instance: float

    @property
    def reserved(self) -> float:
        return float(self.trainer_ranks * self.gpus_per_rank + self.reserved_engines * self.gpus_per_engine)

    @property
    def total(self) -> float:
        return self.reserved + self.preemptible * self.gpus_per_instance

    def describe_reserved(self) -> str:
        return (f"{self.trainer_ranks} trainer ranks x {self.gpus_per_rank:g} + {self.reserved_engines} reserved "
                f"engines x {self.gpus_per_engine:g}")


def check_local(needs: GpuNeeds, gpus: int) -> None:
    """A local cluster is one machine: everything shares its `gpus` GPUs."""
    if needs.total <= 0:
        return
    if needs.total > gpus:
        raise ConfigError(
            f"this run needs {needs.total:g} GPUs ({needs.describe_reserved()}, {needs.preemptible} preemptible "
            f"instances x {needs.gpus_per_instance:g}) and this machine has {gpus}; use a machine or Ray cluster "
            "with them (cluster.address), or fewer ranks, engines or instances")


def check_cluster(needs: GpuNeeds, nodes: Iterable[Mapping[str, float]]) -> None:
    """A joined cluster: reserved nodes (with the `reserved` resource) hold the trainer ranks
    and reserved engines; each preemptible instance needs a preemptible node with
    gpus_per_instance GPUs free. `nodes` are the alive nodes' resources."""
    nodes = list(nodes)
    reserved = sum(n.get("GPU", 0.0) for n in nodes if n.get("reserved", 0) > 0)
    if needs.reserved > reserved:
        raise ConfigError(f"this run needs {needs.reserved:g} GPUs on reserved nodes ({needs.describe_reserved()}) "
                          f"and the cluster's reserved nodes have {reserved:g}")
    if needs.preemptible == 0 or needs.gpus_per_instance <= 0:
        return
    fits = sum(math.floor(n.get("GPU", 0.0) / needs.gpus_per_instance + 1e-9)
               for n in nodes if n.get("preemptible", 0) > 0 and n.get("reserved", 0) <= 0)
    if fits < needs.preemptible:
        have = sum(n.get("GPU", 0.0) for n in nodes if n.get("preemptible", 0) > 0 and n.get("reserved", 0) <= 0)
        raise ConfigError(
            f"this run places up to {needs.preemptible} preemptible instances of {needs.gpus_per_instance:g} GPUs "
            f"and the cluster's preemptible nodes ({have:g} GPUs) hold {fits}; start preemptible nodes with "
            f"GPUs (`ray start --resources='{{\"preemptible\": 1}}'`) or lower cluster.max_preemptible")


def local_gpus() -> int:
    """GPUs a local Ray cluster would see: CUDA_VISIBLE_DEVICES when set, else torch's count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no CUDA runtime at all
        return 0
