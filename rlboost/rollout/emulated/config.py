"""EmulatedEngineConfig: the speeds and token statistics of an emulated engine (the GPU
it stands for), kept apart from the engine so configs import it without the engine.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from rlboost.rollout.emulated.lengths import LengthConfig
from rlboost.timing import ACCELERATORS, MODELS, accelerator, model_shape


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

    With `model` set (a name in rlboost.timing.MODELS) the fixed rates give way to the
    timing model: a decode step of the engine's batch takes the time the timing model gives
    `gpus` `accelerator`s (it grows with the batch's cached tokens), prefill too.
    Each emulated token then stands for token_block real ones (the controller, the
    trainer and the transfer see 1/token_block of the tokens, at the same timings), and
    every duration is divided by time_scale, so a run's minute is time_scale minutes of
    the modelled cluster. `lengths` draws response lengths (lognormal: the long tail of
    reasoning traces) instead of stop_probability.

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
    model: str = ""
    """a model of rlboost.timing (e.g. qwen3-8b): its roofline sets decode and prefill time (empty: the rates above)"""
    accelerator: str = "h100-sxm"
    """the GPU type of rlboost.timing each engine stands for (with model)"""
    gpus: int = 1
    """GPUs one engine spans, tensor parallel (with model)"""
    reserved_gpus: int | None = None
    """GPUs one reserved engine spans (None: gpus), when the trainer's GPUs roll out at another
    tensor-parallel size than the preemptible instances"""
    efficiency: float = 1.0
    """every efficiency of the timing model times this (1: as measured; a what-if, never a fit)"""
    token_block: int = 1
    """real tokens each emulated token stands for (with model; lengths and limits are in emulated tokens)"""
    time_scale: float = 1.0
    """modelled seconds per second of the run: every rate is multiplied by it"""
    startup_s: float = 0.0
    """modelled seconds a preemptible instance takes to start before it pulls weights (divided by time_scale)"""
    memory_fraction: float = 0.0
    """share of each GPU's memory an engine holds for weights and KV cache (0: no KV limit; SGLang's default ~0.85)"""
    reserved_memory_fraction: float | None = None
    """the same for reserved engines, which share their GPUs with the trainer (None: memory_fraction)"""
    reserved_resident_bytes: float = 0.0
    """bytes per GPU the colocated trainer keeps on a reserved engine's GPUs while it rolls out (resident parameters)"""
    lengths: LengthConfig = field(default_factory=LengthConfig)
    """how long responses are: geometric (stop_probability per token) or lognormal (a long tail)"""

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
        if self.model and self.model not in MODELS:
            raise ValueError(f"model must be empty or one of {sorted(MODELS)}, got {self.model!r}")
        if self.accelerator not in ACCELERATORS:
            raise ValueError(f"accelerator must be one of {sorted(ACCELERATORS)}, got {self.accelerator!r}")
        if not 1 <= self.gpus <= 64:
            raise ValueError(f"gpus must be in [1, 64], got {self.gpus}")
        if self.reserved_gpus is not None and not 1 <= self.reserved_gpus <= 64:
            raise ValueError(f"reserved_gpus must be None or in [1, 64], got {self.reserved_gpus}")
        if not 0.0 < self.efficiency <= 1.0:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
        if not 1 <= self.token_block <= 4096:
            raise ValueError(f"token_block must be in [1, 4096], got {self.token_block}")
        if not 0.0 < self.time_scale <= 1e6:
            raise ValueError(f"time_scale must be in (0, 1e6], got {self.time_scale}")
        if not self.startup_s >= 0.0:
            raise ValueError(f"startup_s must be >= 0, got {self.startup_s}")
        if not self.reserved_resident_bytes >= 0.0:
            raise ValueError(f"reserved_resident_bytes must be >= 0, got {self.reserved_resident_bytes}")
        for name in ("memory_fraction", "reserved_memory_fraction"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        for kind in ("reserved", "preemptible"):
            if self.kv_capacity(kind) <= 0:
                raise ValueError(f"{kind} engines' memory share cannot hold the {self.model} weights on "
                                 f"{self.gpus_of(kind)} {self.accelerator}: raise memory_fraction")

    @property
    def per_sample_tokens_per_s(self) -> float:
        """The cap on one sample's decode rate: sample_tokens_per_s, or by default
        decode_tokens_per_s / max_running."""
        if self.sample_tokens_per_s is not None:
            return self.sample_tokens_per_s
        return self.decode_tokens_per_s / self.max_running

    def gpus_of(self, kind: str) -> int:
        """GPUs an engine of this kind spans."""
        return self.reserved_gpus or self.gpus if kind == "reserved" else self.gpus

    def kv_capacity(self, kind: str = "preemptible") -> float:
        """Emulated tokens of KV cache an engine of this kind holds (inf: no limit), as SGLang sizes
        its pool: its memory share of every GPU, less what is already resident there (a
        colocated trainer's state, on reserved engines) and the model's weights, over the
        model's KV bytes per token."""
        fraction = self.memory_fraction
        resident = 0.0
        if kind == "reserved":
            resident = self.reserved_resident_bytes
            if self.reserved_memory_fraction is not None:
                fraction = self.reserved_memory_fraction
        if not self.model or fraction <= 0:
            return math.inf
        shape, gpu = model_shape(self.model), accelerator(self.accelerator)
        free = self.gpus_of(kind) * (gpu.memory_bytes * fraction - resident) - shape.weight_bytes
        return free / shape.kv_bytes_per_token / self.token_block

    def scaled(self, factor: float) -> EmulatedEngineConfig:
        """Every rate times factor (a slower or faster GPU type)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        sample = None if self.sample_tokens_per_s is None else self.sample_tokens_per_s * factor
        return dataclasses.replace(self, decode_tokens_per_s=self.decode_tokens_per_s * factor,
                                   prefill_tokens_per_s=self.prefill_tokens_per_s * factor,
                                   sample_tokens_per_s=sample)
