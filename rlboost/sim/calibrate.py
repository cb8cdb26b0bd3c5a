"""The timing model's one calibration: the efficiency at which the paper recipe's reserved-only
run reaches the RLBoost artifact's baseline (verl's synchronous colocated trainer, about 1,300
tokens/s per GPU x 8 = 10,400 tokens/s of prompt + response for Qwen3-8B GRPO on one 8x H100
node, PolyRL REPRODUCE.md), found by bisection on the simulator. Every other figure, the
artifact's own 1-4 worker curve included, is then a prediction.

    rlboost simulate --calibrate      # prints the efficiency to put in rlboost.timing
"""

from __future__ import annotations

import dataclasses

from rlboost.sim.metrics import summarize
from rlboost.sim.simulator import Simulator
from rlboost.sim.spec import SimSpec

ARTIFACT_BASELINE_TOKENS_PER_S = 10_400.0  # 1,300 x 8, counted as verl counts: prompt + response


def reserved_only(spec: SimSpec) -> SimSpec:
    cluster = dataclasses.replace(spec.cluster, max_preemptible=0, initial_preemptible=0, trace="none")
    return spec.replace(cluster=cluster)


def with_efficiency(spec: SimSpec, efficiency: float) -> SimSpec:
    emulated = dataclasses.replace(spec.rollout.emulated, efficiency=efficiency)
    return spec.replace(rollout=dataclasses.replace(spec.rollout, emulated=emulated))


def baseline_tokens_per_s(spec: SimSpec, efficiency: float, groups=None) -> float:
    """Modelled-cluster tokens/s of the reserved-only run at this efficiency (steps 2..N);
    groups(step) as Simulator takes it."""
    return summarize(Simulator(with_efficiency(reserved_only(spec), efficiency), groups=groups).run()).tokens_per_s


def calibrate(spec: SimSpec, target: float = ARTIFACT_BASELINE_TOKENS_PER_S, tolerance: float = 0.002,
              groups=None) -> float:
    """The efficiency giving `target` tokens/s reserved-only (throughput rises with it)."""
    lo, hi = 0.05, 1.0
    if baseline_tokens_per_s(spec, hi, groups) < target:
        raise ValueError(f"even at full efficiency the reserved-only run stays under {target} tokens/s")
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        if baseline_tokens_per_s(spec, mid, groups) < target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 3)
