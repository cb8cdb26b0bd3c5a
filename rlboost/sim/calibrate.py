"""The timing model's check against verl: the paper recipe's reserved-only run, simulated with
the measured inputs, beside the RLBoost artifact's baseline (verl's synchronous colocated
trainer, about 1,300 tokens/s per GPU x 8 = 10,400 tokens/s of prompt + response for Qwen3-8B
GRPO on one 8x H100 node, PolyRL REPRODUCE.md), with the gap. Nothing is fitted to it: the
factor on every efficiency at which the two would meet is printed as a what-if, never applied.

    rlboost simulate --calibrate      # the check, its gap and the what-if factor
"""

from __future__ import annotations

import dataclasses

from rlboost.sim.metrics import summarize
from rlboost.sim.simulator import Simulator
from rlboost.sim.spec import SimSpec

VERL_BASELINE_TOKENS_PER_S = 10_400.0  # 1,300 x 8, counted as verl counts: prompt + response


def reserved_only(spec: SimSpec) -> SimSpec:
    cluster = dataclasses.replace(spec.cluster, max_preemptible=0, initial_preemptible=0, trace="none")
    return spec.replace(cluster=cluster)


def with_scale(spec: SimSpec, scale: float) -> SimSpec:
    """The spec with every efficiency of the timing model times `scale` (a what-if)."""
    emulated = dataclasses.replace(spec.rollout.emulated, efficiency=scale)
    return spec.replace(rollout=dataclasses.replace(spec.rollout, emulated=emulated))


def baseline_tokens_per_s(spec: SimSpec, scale: float = 1.0, groups=None) -> float:
    """Modelled-cluster tokens/s of the reserved-only run (steps 2..N); groups(step) as
    Simulator takes it."""
    return summarize(Simulator(with_scale(reserved_only(spec), scale), groups=groups).run()).tokens_per_s


def scale_to_meet(spec: SimSpec, target: float = VERL_BASELINE_TOKENS_PER_S, tolerance: float = 0.002,
                  groups=None) -> float:
    """The factor on every efficiency at which the reserved-only run gives `target` tokens/s
    (throughput rises with it): how far the measured inputs are from a figure, not a fit."""
    lo, hi = 0.05, 1.0
    if baseline_tokens_per_s(spec, hi, groups) < target:
        raise ValueError(f"even as measured the reserved-only run stays under {target:.0f} tokens/s")
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        if baseline_tokens_per_s(spec, mid, groups) < target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 3)
