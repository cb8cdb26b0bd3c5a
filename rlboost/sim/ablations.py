"""What-ifs of the RLBoost paper's ablations on a simulated run (SimSpec's seeding, migration,
window_memory and preempt): the published window rule without its per-count memory, and
instances killed together at a moment of a step (and replaced later, or not).

The live controller has none of these switches; they exist to set the paper's ablation
figures (Figs. 12 and 14) beside what the same model predicts.
"""

from __future__ import annotations

from rlboost.controller.offload import ReferenceWindowRule


class ReferenceRuleWithoutMemory(ReferenceWindowRule):
    """The published window rule (gap rule, floor, whole seconds) that remembers no window per
    instance count: nothing is folded in, and a changed count starts from the current window."""

    def __init__(self, rule: ReferenceWindowRule):
        super().__init__(rule.config)
        self.optima = {}

    def _fold(self, count: int, weight: float) -> None:
        return None


def without_memory(policy):
    """The policy with the reference rule's memory off (other policies have none to turn off)."""
    return ReferenceRuleWithoutMemory(policy) if isinstance(policy, ReferenceWindowRule) else policy


def victims(nodes, count: int) -> list[str]:
    """The `count` live preemptible instances to kill together: the longest up first (ties by
    id), as a zone-wide reclaim takes instances regardless of their work."""
    up = sorted((n for n in nodes if n.kind == "preemptible" and n.alive and n.rates is not None),
                key=lambda n: (n.placed_at, n.instance_id))
    return [n.instance_id for n in up[:count]]
