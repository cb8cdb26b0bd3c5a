"""What-ifs of the RLBoost paper's ablations on a simulated run (SimSpec's seeding, migration,
window_memory and preempt): the published window rule without its per-count memory (the
controller's window.reference.memory), and instances killed together at a moment of a step
(and replaced later, or not). Seeding and migration are modes of the simulator's moves
(sim.mover).

They exist to set the paper's ablation figures (Figs. 12 and 14) beside what the same model
predicts.
"""

from __future__ import annotations

import dataclasses

from rlboost.controller.offload import ReferenceWindowRule


def without_memory(policy):
    """The policy with the reference rule's memory off (ReferenceWindowConfig.memory; other
    policies have none to turn off)."""
    if isinstance(policy, ReferenceWindowRule):
        return ReferenceWindowRule(dataclasses.replace(policy.config, memory=False))
    return policy


def victims(nodes, count: int) -> list[str]:
    """The `count` live preemptible instances to kill together: the longest up first (ties by
    id), as a zone-wide reclaim takes instances regardless of their work."""
    up = sorted((n for n in nodes if n.kind == "preemptible" and n.alive and n.rates is not None),
                key=lambda n: (n.placed_at, n.instance_id))
    return [n.instance_id for n in up[:count]]
