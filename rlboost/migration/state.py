"""RequestState: everything needed to continue one sample on another engine.

A sample is a single generation (one member of a prompt group). Its state is frozen and
versioned because it crosses processes; the native codec (rlboost._C) packs many states
into one checksummed buffer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

STATE_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingParams:
    """How to draw tokens for one sample.

    >>> SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=64, stop_token_ids=(2,))
    SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=64, stop_token_ids=(2,))

    temperature == 0 means greedy; top_k == 0 and top_p == 1 disable those filters.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestState:
    """One sample's progress: prompt, tokens generated so far and how to continue.

    >>> s = RequestState(sample_id=7, prompt_ids=(1, 2, 3), params=SamplingParams(max_new_tokens=4),
    ...                  seed=1234, weight_version=3, output_ids=(9,), output_logprobs=(-0.25,))
    >>> s.position, s.remaining_tokens
    (4, 3)

    output_logprobs hold float32 values (the codec stores them as float32, losslessly).
    The random draw for output token t depends only on (seed, sample_id, t), so the sample
    continues identically on any engine.
    """

    sample_id: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    weight_version: int
    output_ids: tuple[int, ...] = ()
    output_logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None  # None while running; "stop" or "length" when done
    format_version: int = STATE_FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.format_version != STATE_FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version} is not {STATE_FORMAT_VERSION}")
        if not 0 <= self.sample_id < 2**64:
            raise ValueError(f"sample_id must fit in u64, got {self.sample_id}")
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"output_ids ({len(self.output_ids)}) and output_logprobs "
                f"({len(self.output_logprobs)}) differ in length")
        if self.finish_reason not in (None, "stop", "length"):
            raise ValueError(f"finish_reason must be None, 'stop' or 'length', got {self.finish_reason!r}")

    @property
    def position(self) -> int:
        """Number of tokens in the sequence so far (prompt + output)."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining_tokens(self) -> int:
        """Upper bound on tokens still to generate."""
        if self.finish_reason is not None:
            return 0
        return self.params.max_new_tokens - len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extended(self, ids: tuple[int, ...], logprobs: tuple[float, ...],
                 finish_reason: str | None = None) -> RequestState:
        """Return a copy with more output tokens appended."""
        return dataclasses.replace(
            self, output_ids=self.output_ids + tuple(ids),
            output_logprobs=self.output_logprobs + tuple(logprobs), finish_reason=finish_reason)
