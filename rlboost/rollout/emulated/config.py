"""EmulatedEngineConfig: the speeds and token statistics of an emulated engine (the GPU
it stands for), kept apart from the engine so configs import it without the engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class EmulatedEngineConfig:
    """Speeds and token statistics of an emulated engine.

    decode_tokens_per_s is the engine's aggregate decode rate, reached when max_running
    samples decode at once; sample_tokens_per_s caps each sample's rate (so with k samples
    each decodes at min(sample, aggregate / k)). Its default (None) is
    decode_tokens_per_s / max_running: a sample's rate does not grow when the batch is
    short, as on a GPU whose decode step takes the same time at any batch size up to
    max_running. Set it higher to let a short batch decode faster per sample.
    Each token is eos_token_id with probability stop_probability; a sample stops there
    when eos_token_id is among its stop_token_ids (as a trainer sets it). A preemptible
    instance runs at preemptible_speed times every rate (e.g. 0.5: an older GPU type than
    the reserved engines'); vocab_size, eos_token_id and max_model_len are fitted to the
    model when an instance is built (see fitted_to).

    >>> EmulatedEngineConfig(decode_tokens_per_s=8000.0).per_sample_tokens_per_s
    125.0
    """

    decode_tokens_per_s: float = 2000.0
    """the engine's decode rate when max_running samples decode at once"""
    sample_tokens_per_s: float | None = None
    """one sample's decode rate cap (None: decode_tokens_per_s / max_running)"""
    prefill_tokens_per_s: float = 20000.0
    """prompt tokens prefilled per second, one prompt at a time"""
    max_running: int = 64
    """samples decoding at once"""
    vocab_size: int = 32000
    """token ids drawn from [0, vocab_size) (set from the model when a run builds the engine)"""
    stop_probability: float = 0.01
    """chance each token is the end-of-sequence token"""
    eos_token_id: int = 2
    """the end-of-sequence token (set from the model when a run builds the engine)"""
    rate_window_s: float = 1.0
    """decode tokens/s is measured over this much recent busy time"""
    max_model_len: int | None = None
    """longest prompt + output admitted (None: the model's maximum)"""
    preemptible_speed: float = 1.0
    """preemptible instances run at this times every rate (reserved ones at 1)"""

    def __post_init__(self) -> None:
        for name in ("decode_tokens_per_s", "prefill_tokens_per_s", "rate_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.sample_tokens_per_s is not None and not self.sample_tokens_per_s > 0:
            raise ValueError(f"sample_tokens_per_s must be > 0 or None (decode_tokens_per_s / "
                             f"max_running), got {self.sample_tokens_per_s}")
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if not 0.0 <= self.stop_probability <= 1.0:
            raise ValueError(f"stop_probability must be in [0, 1], got {self.stop_probability}")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(f"eos_token_id must be in [0, vocab_size), got {self.eos_token_id}")
        if not 0.0 < self.preemptible_speed <= 1000.0:
            raise ValueError(f"preemptible_speed must be in (0, 1000], got {self.preemptible_speed}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 or None, got {self.max_model_len}")

    @property
    def per_sample_tokens_per_s(self) -> float:
        """The cap on one sample's decode rate: sample_tokens_per_s, or by default
        decode_tokens_per_s / max_running."""
        if self.sample_tokens_per_s is not None:
            return self.sample_tokens_per_s
        return self.decode_tokens_per_s / self.max_running

    def scaled(self, factor: float) -> EmulatedEngineConfig:
        """Every rate times factor (a slower or faster GPU type)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        sample = None if self.sample_tokens_per_s is None else self.sample_tokens_per_s * factor
        return dataclasses.replace(self, decode_tokens_per_s=self.decode_tokens_per_s * factor,
                                   prefill_tokens_per_s=self.prefill_tokens_per_s * factor,
                                   sample_tokens_per_s=sample)
