"""How fast an emulated engine decodes and prefills: at fixed configured rates, or at the
timing model's roofline for a named model on named GPUs (rlboost.timing).

Both answer in the engine's own units (emulated tokens, each standing for token_block real
ones) and in the run's seconds (the modelled GPU's seconds divided by time_scale); `speed`
scales every rate (a slower instance type, a throttled GPU).
"""

from __future__ import annotations

from typing import Protocol

from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.timing import GpuTiming, gpu_timing


class Pace(Protocol):
    def decode_time(self, k: int, context: float, tokens: float, speed: float) -> float:
        """Seconds for each of k decoding samples (context cached tokens in all) to advance
        `tokens` tokens."""

    def decode_tokens(self, k: int, context: float, seconds: float, speed: float) -> float:
        """Tokens each of k decoding samples advances in `seconds` (the inverse)."""

    def prefill_time(self, tokens: float, past: float, speed: float) -> float:
        """Seconds one sample adds to a prefill batch: `tokens` tokens after `past` cached ones."""

    def prefill_batch_time(self, samples: list[float], speed: float) -> float:
        """Seconds a prefill batch takes, from its samples' prefill_time at speed 1."""


class FixedPace:
    """Each of k samples decodes at min(per-sample rate, aggregate / k); prefill at a fixed rate.

    >>> FixedPace(EmulatedEngineConfig(decode_tokens_per_s=100.0, max_running=4)).decode_time(2, 0, 50, 1.0)
    2.0
    """

    def __init__(self, config: EmulatedEngineConfig):
        scale = config.time_scale
        self.per_sample = config.per_sample_tokens_per_s * scale
        self.aggregate = config.decode_tokens_per_s * scale
        self.prefill_rate = config.prefill_tokens_per_s * scale

    def _rate(self, k: int, speed: float) -> float:
        return min(self.per_sample, self.aggregate / max(1, k)) * speed

    def decode_time(self, k: int, context: float, tokens: float, speed: float) -> float:
        return max(0.0, tokens) / self._rate(k, speed)

    def decode_tokens(self, k: int, context: float, seconds: float, speed: float) -> float:
        return max(0.0, seconds) * self._rate(k, speed)

    def prefill_time(self, tokens: float, past: float, speed: float) -> float:
        return max(0.0, tokens) / (self.prefill_rate * speed)

    def prefill_batch_time(self, samples: list[float], speed: float) -> float:
        return sum(samples) / speed  # prompts one after another at the fixed rate


class RooflinePace:
    """The timing model's decode and prefill for config.model on config.gpus config.accelerator.

    A decode step's time grows with the batch's cached tokens, so the rate of a sample falls
    as its batch's contexts grow, and rises as the batch thins out at the tail of a step.
    """

    def __init__(self, config: EmulatedEngineConfig, timing: GpuTiming | None = None, kind: str = "preemptible"):
        self.timing = timing or gpu_timing(config.model, config.accelerator, config.gpus_of(kind), config.efficiency)
        self.block = float(config.token_block)
        self.scale = config.time_scale

    def decode_time(self, k: int, context: float, tokens: float, speed: float) -> float:
        b = self.block
        return self.timing.decode_time_s(k, context * b, tokens * b) / (self.scale * speed)

    def decode_tokens(self, k: int, context: float, seconds: float, speed: float) -> float:
        b = self.block
        return self.timing.decode_steps_in(k, context * b, seconds * self.scale * speed) / b

    def prefill_time(self, tokens: float, past: float, speed: float) -> float:
        b = self.block
        return self.timing.prefill_compute_s(tokens * b, past * b) / (self.scale * speed)

    def prefill_batch_time(self, samples: list[float], speed: float) -> float:
        """The samples' compute, or one read of the weights, whichever is longer."""
        return max(sum(samples), self.timing.weights_read_s() / self.scale) / speed


def pace_of(config: EmulatedEngineConfig, kind: str = "preemptible") -> Pace:
    """The timing model for an engine of this kind when the config names a model, else its fixed rates."""
    return RooflinePace(config, kind=kind) if config.model else FixedPace(config)
