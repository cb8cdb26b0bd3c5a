"""What a simulated (or emulated) run achieved, in the modelled cluster's units: tokens/s,
dollars per hour, tokens per dollar, idle times and preemptions, over the steps after the
first (which includes start-up and the first weight pulls, as cost_efficiency counts it).
With controller.max_staleness >= 1 each step also has its staleness histogram: trained
output tokens by lag (step - the weight version that produced them).

Tokens are counted as the RLBoost artifact counts its throughput (verl's perf/throughput: the
attention mask, prompt + response of every sample, over the step's wall time); the
generated (response) tokens are kept beside them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rlboost.controller.staleness import largest_lag
from rlboost.sim.simulator import SimResult


def staleness_fields(lags: tuple[int, ...], block: int) -> dict:
    """With max_staleness >= 1: the trained output tokens at lag 0, 1, .. (step - the version
    that produced them), real tokens, and the share not from the step's own version."""
    if len(lags) < 2:
        return {}
    total = sum(lags)
    return {"staleness_tokens": [n * block for n in lags],
            "stale_share": round(1.0 - lags[0] / total, 4) if total else 0.0, "largest_lag": largest_lag(lags)}


@dataclass(frozen=True, slots=True)
class SimSummary:
    """Figures of one run over its steps 2..N (real tokens, modelled seconds and dollars);
    tokens are prompt + response, generated_tokens the responses alone."""

    steps: int
    tokens: float
    seconds: float
    usd: float
    trainer_idle_s: float        # per step, mean
    rollout_idle_s: float        # per step, mean
    window_s: float              # per step, mean
    offload_share: float         # per step, mean
    preemptions: int
    deaths: int
    mean_preemptible: float
    generated_tokens: float = 0.0
    staleness: tuple[int, ...] = ()  # trained output tokens at lag 0..max_staleness (real), summed

    @property
    def generated_tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def usd_per_hour(self) -> float:
        return self.usd / self.seconds * 3600.0 if self.seconds > 0 else 0.0

    @property
    def tokens_per_usd(self) -> float:
        return self.tokens / self.usd if self.usd > 0 else 0.0

    def as_dict(self) -> dict:
        return {"steps": self.steps, "tokens": int(self.tokens), "generated_tokens": int(self.generated_tokens),
                "seconds": round(self.seconds, 1),
                "usd": round(self.usd, 4), "tokens_per_s": round(self.tokens_per_s, 1),
                "generated_tokens_per_s": round(self.generated_tokens_per_s, 1),
                "usd_per_hour": round(self.usd_per_hour, 3), "tokens_per_usd": round(self.tokens_per_usd, 1),
                "trainer_idle_s": round(self.trainer_idle_s, 2), "rollout_idle_s": round(self.rollout_idle_s, 2),
                "window_s": round(self.window_s, 2), "offload_share": round(self.offload_share, 4),
                "preemptions": self.preemptions, "deaths": self.deaths,
                "mean_preemptible": round(self.mean_preemptible, 2)} | staleness_fields(self.staleness, 1)


def summarize(result: SimResult, skip: int = 1) -> SimSummary:
    """Steps after the first `skip` of a simulated run, scaled to the modelled cluster."""
    spec = result.spec
    scale, block = spec.time_scale, spec.token_block
    if len(result.steps) <= skip:
        raise ValueError(f"the run has {len(result.steps)} steps: nothing after the first {skip} to measure")
    first, rest = result.steps[skip - 1] if skip else None, result.steps[skip:]
    usd = rest[-1].cost_usd - (first.cost_usd if first else 0.0)
    metrics = [s.metrics for s in rest]
    return SimSummary(
        steps=len(rest), tokens=float(sum(s.sequence_tokens for s in rest) * block),
        generated_tokens=float(sum(m.total_tokens for m in metrics) * block),
        seconds=sum(s.wall_s for s in rest) * scale, usd=usd,
        trainer_idle_s=statistics.mean(m.trainer_idle_s for m in metrics) * scale,
        rollout_idle_s=statistics.mean(m.rollout_idle_s for m in metrics) * scale,
        window_s=statistics.mean(m.window_s for m in metrics) * scale,
        offload_share=statistics.mean(m.offload_share for m in metrics),
        preemptions=sum(m.preemptions for m in metrics), deaths=sum(m.deaths for m in metrics),
        mean_preemptible=statistics.mean(s.preemptible_up for s in rest),
        staleness=tuple(sum(lags) * block for lags in zip(*(s.staleness for s in rest))))
