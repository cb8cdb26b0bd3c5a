"""What an offload policy sees and learns from: the running step (WindowContext), a finished
step (StepObservation), the WindowPolicy interface every policy implements, and the
shortest step the measured rates allow (ideal_step_time)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class WindowContext:
    """What is known during a step when the window is reconsidered."""

    elapsed_s: float             # since the step started
    generated_tokens: int        # tokens of this step collected so far
    remaining_tokens: float      # expected tokens still to come from unfinished samples
    local_tokens_per_s: float    # reserved instances, aggregate when full
    remote_tokens_per_s: float   # routable preemptible instances, aggregate when full
    num_preemptible: int


@dataclass(frozen=True, slots=True)
class StepObservation:
    """What one finished step measured, for the next step's window."""

    window_s: float
    num_preemptible: int
    total_tokens: int
    step_time_s: float
    trainer_idle_s: float        # trainer waiting for micro-batches after the window closed
    rollout_idle_s: float        # from the last sample finishing to the end of the step
    train_busy_s: float          # step time minus window minus trainer idle
    last_microbatch_tokens: int
    # each micro-batch taken after the window: (taken at, ((group ready at, group tokens), ...)),
    # in seconds since the step started
    deliveries: tuple = ()

    @classmethod
    def measured(cls, metrics, meter) -> StepObservation:
        """From a finished step's frozen StepMetrics and the StepMeter that measured it. A step
        started ahead (bounded staleness) counts only what came after the reserved
        instances joined it: its tokens collected before then were made during the previous
        step's training, which is the overlap the next window should not pay for again."""
        return cls(window_s=metrics.window_s, num_preemptible=metrics.num_preemptible,
                   total_tokens=metrics.total_tokens - metrics.early_tokens, step_time_s=metrics.step_time_s,
                   trainer_idle_s=metrics.trainer_idle_s, rollout_idle_s=metrics.rollout_idle_s,
                   train_busy_s=max(0.0, metrics.step_time_s - metrics.window_s - metrics.trainer_idle_s),
                   last_microbatch_tokens=meter.last_microbatch_tokens, deliveries=tuple(meter.deliveries))


class WindowPolicy(Protocol):
    def plan(self, ctx: WindowContext) -> float:
        """The window this step is expected to get (reported in metrics); called once as a step starts."""

    def should_close(self, ctx: WindowContext) -> bool:
        """Close the local window now? (Only asked while a preemptible instance can take the rest.)"""

    def observe(self, obs: StepObservation) -> None:
        """Learn from a finished step."""


def ideal_step_time(total_tokens: float, train_s: float, local_tokens_per_s: float,
                    remote_tokens_per_s: float) -> float:
    """Shortest step the rates allow: the reserved cluster rolls out for w then trains for train_s,
    and local plus remote throughput must cover every token.

    >>> ideal_step_time(1000.0, 5.0, 100.0, 100.0)  # w = (1000 - 100 * 5) / 200
    7.5
    """
    rate = local_tokens_per_s + remote_tokens_per_s
    if rate <= 0:
        return math.inf
    return train_s + max(0.0, (total_tokens - remote_tokens_per_s * train_s) / rate)
