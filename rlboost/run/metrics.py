"""One line of metrics.jsonl per step: the controller's step metrics, the trainer's
outcome, time per phase, weight pulls (bytes per instance, deltas or full versions) and
costs (the bytes pulled from the trainer are charged to the ledger here, once per step).

Besides loss, kl and grad_norm, a step's line holds lr (the optimizer's learning rate),
response_length_mean and response_length_max (output tokens per trained sample) and
entropy: the mean -log p of the sampled tokens as the engines scored them, an estimate of
the sampling policy's entropy per token (from the samples, not from full logits).
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager
from typing import Iterator

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.instance import PullRecord
from rlboost.controller.metrics import StepMetrics
from rlboost.controller.staleness import largest_lag
from rlboost.trainer.loop import StepOutcome


class Phases:
    """Wall time per named phase of one step: `with phases("train"): ...`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    @property
    def total(self) -> float:
        return time.perf_counter() - self._t0


def step_record(step: int, outcome: StepOutcome, rollout: StepMetrics, phases: Phases,
                pulls: list[PullRecord], publish: dict, instances_up: int, ledger: CostLedger,
                elapsed_s: float, example: dict) -> dict:
    """One line of metrics.jsonl; charges the step's pulls to the ledger first."""
    charge_pulls(ledger, pulls)
    rec = {k: v for k, v in dataclasses.asdict(rollout).items() if k != "format_version"}
    rec["tokens_per_instance"] = dict(rollout.tokens_per_instance)
    phase = dict(phases.seconds)
    phase["wait"] = outcome.wait_s  # trainer idle, waiting for groups still being generated
    phase["train"] = max(0.0, phase.get("train", 0.0) - outcome.wait_s)
    cost = ledger.summary(at_s=elapsed_s)
    rec.update({
        "step": step, "reward_mean": outcome.reward_mean, "reward_std": _std(outcome.rewards),
        "tokens_per_s": _rollout_rate(rollout),
        "instances_up": instances_up,
        "weight_pull_s": max((p.pull_s for p in pulls), default=0.0),
        "weight_load_s": max((p.load_s for p in pulls), default=0.0),
        "weight_peer_bytes": sum(p.peer_bytes for p in pulls), "pulls": len(pulls),
        **_pull_bytes(pulls), "egress_usd": cost.egress_usd,
        "publish_bytes": publish.get("bytes", 0), "publish_delta": publish.get("delta", {}),
        "samples_trained": outcome.samples,
        "samples_unique": outcome.unique_samples, "sample_versions": sorted(outcome.versions),
        "microbatches": outcome.microbatches,
        **({"staleness_tokens": list(outcome.staleness), "largest_lag": largest_lag(outcome.staleness)}
           if outcome.staleness else {}),
        "response_tokens": outcome.denominator, **outcome.train, **_responses(outcome),
        "step_wall_s": phases.total, "elapsed_s": elapsed_s,
        "cost_usd": cost.total_usd, "reserved_usd": cost.reserved_usd, "tokens_billed": cost.tokens,
    })
    rec.update({f"phase_{k}_s": v for k, v in phase.items()})
    rec.update(example)
    return rec


def _responses(outcome: StepOutcome) -> dict:
    lengths = outcome.response_lengths
    if not lengths:
        return {}
    return {"response_length_mean": sum(lengths) / len(lengths), "response_length_max": max(lengths),
            "entropy": outcome.sampled_nll / max(1, sum(lengths))}


def _rollout_rate(rollout: StepMetrics) -> float:
    """Tokens per second of the step's rollout; a step started ahead (bounded staleness)
    rolled out for early_s before its own timing began, and made early_tokens then."""
    seconds = rollout.rollout_time_s + rollout.early_s
    return rollout.total_tokens / seconds if seconds > 0 else 0.0


def _pull_bytes(pulls: list[PullRecord]) -> dict:
    """Bytes the step's pulls moved: in all, per instance, from the trainer (egress), and
    how many took a delta instead of the full version (of weight_version_bytes)."""
    return {"weight_bytes": sum(p.bytes for p in pulls),
            "weight_bytes_per_instance": {p.instance_id: p.bytes for p in pulls},
            "weight_egress_bytes": sum(p.egress_bytes for p in pulls),
            "weight_delta_pulls": sum(p.route == "delta" for p in pulls),
            "weight_version_bytes": max((p.nbytes for p in pulls), default=0)}


def charge_pulls(ledger: CostLedger, pulls: list[PullRecord]) -> None:
    """Adds the bytes each pull fetched from the trainer to its pool's egress (each pull
    record belongs to exactly one step: the step of its version)."""
    for p in pulls:
        ledger.add_egress(p.kind, p.egress_bytes)


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
