"""Where a run's environment host goes: never on a preemptible node, whose loss would take
every episode's tool state with it. Nodes with the `reserved` resource and nodes without
the `preemptible` one (CPU-only nodes started for environments, a head node) qualify; of
those, a node without GPUs is preferred (environments then take no CPU from the trainer's
nodes), then the one with the most CPUs. A local cluster's one node is reserved as well as
preemptible, and qualifies.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.environments.config import EnvironmentConfig
from rlboost.environments.host import EnvironmentHost
from rlboost.environments.turns import EpisodeHost
from rlboost.errors import ConfigError


def environment_node(nodes: Iterable[Mapping[str, Any]]) -> str:
    """The node id the host goes on, from ray.nodes()' records; ConfigError when every alive
    node is preemptible only.

    >>> environment_node([{"NodeID": "a", "Alive": True, "Resources": {"CPU": 8, "preemptible": 1}},
    ...                   {"NodeID": "b", "Alive": True, "Resources": {"CPU": 4, "GPU": 8, "reserved": 1}},
    ...                   {"NodeID": "c", "Alive": True, "Resources": {"CPU": 2}}])
    'c'
    """
    alive = [n for n in nodes if n.get("Alive")]
    fit = [n for n in alive if n["Resources"].get("reserved", 0) > 0 or n["Resources"].get("preemptible", 0) <= 0]
    if not fit:
        raise ConfigError(f"the environment host needs a node that is not preemptible (a reserved node, or one "
                          f"without the `preemptible` resource), and all {len(alive)} alive nodes are preemptible")
    best = max(fit, key=lambda n: (n["Resources"].get("GPU", 0) <= 0, n["Resources"].get("CPU", 0)))
    return str(best["NodeID"])


def start_environment_host(config: EnvironmentConfig, *, name: str = "rlboost-environments",
                           node_id: str | None = None, tokenizer_dir: str | None = None, chat: bool = False) -> Any:
    """The host as a Ray actor pinned to node_id (None: environment_node of the cluster's
    nodes). Its methods are async: calls from many drivers run concurrently, and its
    environments' steps run on its own worker threads. It asks for no CPU of Ray's (the
    steps' threads are bounded by config.workers). tokenizer_dir: the host speaks token ids
    with that tokenizer (an EpisodeHost, what a training run's episode driver calls; chat:
    observations in its chat template)."""
    node_id = node_id or environment_node(ray.nodes())
    cls, extra = (EnvironmentHost, {}) if tokenizer_dir is None else \
        (EpisodeHost, {"tokenizer_dir": tokenizer_dir, "chat": chat})
    actor = ray.remote(cls).options(
        num_cpus=0, max_restarts=0, max_concurrency=max(1000, 4 * config.workers),
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    return actor.remote(config, name=name, **extra)
