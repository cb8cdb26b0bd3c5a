"""EmulatedEngine: a RolloutEngine that takes the time a configured GPU would, with deterministic tokens.

Token t of a sample is a hash of (weights, prompt, seed, sample_id, t) (greedy samples:
of weights, prompt and t only); an end-of-sequence token appears with a set probability
drawn from the same hash, so lengths vary when it is a stop token, yet never depend on
which engine, or how many, generated the sample. Time comes from an injectable clock.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from rlboost.errors import EngineBusy, RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.state import RequestState
from rlboost.rollout.admission import validate_states
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.rollout.emulated.lengths import prompt_key, response_length
from rlboost.rollout.emulated.pace import pace_of
from rlboost.rollout.emulated.schedule import DONE, BatchSchedule
from rlboost.rollout.emulated.tokens import (
    KV_LAYOUT,
    check_kv_pages,
    emulated_tokens,
    kv_pages,
    sample_key,
    weights_fingerprint,
)
from rlboost.rollout.engine import EngineLoad, TokenDelta

__all__ = ["KV_LAYOUT", "EmulatedEngine", "EmulatedEngineConfig", "emulated_tokens", "sample_key",
           "weights_fingerprint"]

class _RealClock:
    virtual = False

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class _Sample:
    """A sample's tokens and what has been reported of them (its timing is the schedule's)."""

    __slots__ = ("state", "ids", "logprobs", "length", "finish_reason", "base", "polled")

    def __init__(self, state: RequestState, config: EmulatedEngineConfig, weights: int):
        params = state.params
        self.state = state
        self.base = len(state.output_ids)
        lognormal = config.lengths.kind == "lognormal"
        self.ids, self.logprobs = emulated_tokens(
            sample_key(weights, state), self.base, params.max_new_tokens, vocab_size=config.vocab_size,
            eos_token_id=config.eos_token_id, eos_probability=0.0 if lognormal else config.stop_probability)
        if lognormal:
            self.length, self.finish_reason = self._drawn_length(config)
        else:
            hits = np.flatnonzero(np.isin(self.ids, params.stop_token_ids)) if params.stop_token_ids else []
            if len(hits):
                self.length, self.finish_reason = self.base + int(hits[0]) + 1, "stop"
            else:
                self.length, self.finish_reason = params.max_new_tokens, "length"
        self.polled = self.base        # output index of the next token a delta will report

    def _drawn_length(self, config: EmulatedEngineConfig) -> tuple[int, str]:
        """A length from the length model (independent of weights and engine): the sample ends
        with eos there, and no earlier token is a stop token."""
        params = self.state.params
        length = max(self.base + 1, response_length(config.lengths, prompt_key(self.state.prompt_ids, self.state.seed),
                                                    self.state.sample_id, params.max_new_tokens,
                                                    config.token_block))
        stops = np.array(sorted(set(params.stop_token_ids) | {config.eos_token_id}))
        body = self.ids[:length - self.base - 1]
        for _ in range(len(stops) + 1):  # a drawn id that would end the sample early moves on
            hit = np.isin(body, stops)
            if not hit.any():
                break
            body[hit] = (body[hit] + 1) % config.vocab_size
        if length < params.max_new_tokens:
            self.ids[length - self.base - 1] = config.eos_token_id
            return length, "stop"
        return length, "length"

    def delta(self, upto: int, version: int) -> TokenDelta | None:
        if upto <= self.polled:
            return None
        lo, hi = self.polled - self.base, upto - self.base
        d = TokenDelta(sample_id=self.state.sample_id, start=self.polled,
                       ids=tuple(self.ids[lo:hi].tolist()), logprobs=tuple(self.logprobs[lo:hi].tolist()),
                       finish_reason=self.finish_reason if upto == self.length else None,
                       weight_version=version)
        self.polled = upto
        return d

    def export(self, upto: int) -> RequestState:
        n = upto - self.base
        return self.state.extended(tuple(self.ids[:n].tolist()), tuple(self.logprobs[:n].tolist()))


class EmulatedEngine:
    """A RolloutEngine whose timing follows a configured GPU and whose tokens are a hash.

    >>> from rlboost.migration.state import SamplingParams
    >>> class HandClock:  # time moves when the caller says (rlboost.controller.clock has real ones)
    ...     virtual, t = True, 0.0
    ...     def now(self): return self.t
    >>> clock = HandClock()
    >>> eng = EmulatedEngine(EmulatedEngineConfig(sample_tokens_per_s=10.0), clock=clock)
    >>> eng.load_weights({}, version=0)
    >>> eng.submit([RequestState(sample_id=1, prompt_ids=(1,), params=SamplingParams(max_new_tokens=5),
    ...                          seed=0, weight_version=0)])
    >>> clock.t = 0.35
    >>> [len(d.ids) for d in eng.poll(0.0)]
    [3]

    Decode: k decoding samples advance together, each at min(per-sample rate, decode_tokens_per_s
    / k), or, with config.model, one roofline step of the whole batch at a time (its time
    grows with the batch's cached tokens; see pace.RooflinePace); prefill runs one sample
    at a time beside decode. `speed` scales every rate (set_speed changes it later); `kind`
picks the KV capacity (reserved engines may hold less, sharing their GPUs with the trainer). Its KV pages are
    stand-ins (each cached position's token id and index, layout KV_LAYOUT): they travel and
    are checked like real ones, and an import with pages spares the prefill they stand for.
    top_k and top_p do not change the emulated tokens. abort drops a sample whole, the
    undelivered last delta of a finished one included. The clock is any object with now(),
    a `virtual` flag and, unless virtual, sleep(s); by default the monotonic clock.
    One caller at a time is expected (as a Ray actor has).
    """

    def __init__(self, config: EmulatedEngineConfig | None = None, *, clock: Any = None, speed: float = 1.0,
                 kind: str = "preemptible"):
        self.config = config or EmulatedEngineConfig()
        self.clock = clock if clock is not None else _RealClock()
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self._pace = pace_of(self.config, kind)
        self._schedule = BatchSchedule(self._pace, self.config.max_running, now=self.clock.now(), speed=speed,
                                       rate_window_s=self.config.rate_window_s,
                                       kv_capacity=self.config.kv_capacity(kind))
        self._lock = threading.RLock()
        self._samples: dict[int, _Sample] = {}
        self._version = -1
        self._weights = 0
        self._schema: dict[str, tuple] | None = None
        self._closed = False

    @property
    def kv_layout(self):
        return KV_LAYOUT

    @property
    def max_model_len(self) -> int | None:
        return self.config.max_model_len

    # -- time model -------------------------------------------------------------------------

    def _advance(self) -> None:
        self._schedule.advance(self.clock.now())

    def _drop(self, sid: int) -> _Sample | None:
        self._schedule.drop(sid)
        return self._samples.pop(sid, None)

    def _check_open(self) -> None:
        if self._closed:
            raise RolloutError("emulated engine is closed")

    # -- RolloutEngine protocol -------------------------------------------------------------

    def submit(self, states: Sequence[RequestState]) -> None:
        self._admit_states(list(states), kv_tokens=None)

    def _admit_states(self, states: list, kv_tokens: Sequence[int] | None) -> None:
        with self._lock:
            self._check_open()
            # all or nothing: a refused batch admits no sample
            validate_states(states, known=self._samples, version=self._version,
                            vocab_size=self.config.vocab_size, max_model_len=self.config.max_model_len)
            self._advance()
            for i, st in enumerate(states):
                cached = kv_tokens[i] if kv_tokens is not None else 0
                prefill = self._pace.prefill_time(float(max(1, st.position - cached)), float(cached), 1.0)
                sample = self._samples[st.sample_id] = _Sample(st, self.config, self._weights)
                self._schedule.admit(st.sample_id, prompt_len=len(st.prompt_ids), base=sample.base,
                                     length=sample.length, prefill_s=prefill)

    def poll(self, timeout_s: float) -> list[TokenDelta]:
        deadline = self.clock.now() + max(0.0, timeout_s)
        while True:
            with self._lock:
                self._check_open()
                self._advance()
                deltas = self._collect()
                wait = self._next_token_in()
            now = self.clock.now()
            if deltas or self.clock.virtual or now >= deadline:
                return deltas
            self.clock.sleep(max(1e-4, min(deadline - now, wait)))

    def _next_token_in(self) -> float:
        return self._schedule.next_token_in()

    def _collect(self) -> list[TokenDelta]:
        out: list[TokenDelta] = []
        finished = []
        schedule = self._schedule
        for sid, s in self._samples.items():
            d = s.delta(schedule.produced(sid), self._version)
            if d is not None:
                out.append(d)
            if s.polled == s.length and schedule.phase(sid) == DONE:
                finished.append(sid)
        for sid in finished:
            self._drop(sid)
        return out

    def abort(self, sample_ids: Sequence[int]) -> None:
        with self._lock:
            self._check_open()
            self._advance()
            for sid in sample_ids:
                self._drop(sid)

    def export_states(self, sample_ids: Sequence[int] | None = None, *, with_kv: bool = False) -> MigrationBatch:
        with self._lock:
            self._check_open()
            self._advance()
            ids = list(self._samples) if sample_ids is None else list(dict.fromkeys(sample_ids))
            # finished samples stay: their last delta is still due to the next poll
            ids = [i for i in ids if i in self._samples and self._schedule.phase(i) != DONE]
            states = []
            for sid in ids:
                states.append(self._samples[sid].export(self._schedule.produced(sid)))
                self._drop(sid)
        if not with_kv:
            return MigrationBatch(states=tuple(states))
        pages = [kv_pages(st) for st in states]
        return MigrationBatch(states=tuple(states), kv_layout=KV_LAYOUT, kv_tokens=tuple(n for n, _ in pages),
                              kv_data=tuple(d for _, d in pages))

    def import_states(self, batch: MigrationBatch) -> None:
        if batch.kv_layout is None:
            self._admit_states(list(batch.states), kv_tokens=None)
            return
        if not batch.kv_layout.compatible_with(KV_LAYOUT):
            raise RolloutError(f"KV pages in layout {batch.kv_layout} cannot be used here (needs {KV_LAYOUT})")
        for st, n, data in zip(batch.states, batch.kv_tokens, batch.kv_data):
            check_kv_pages(st, n, data)
        self._admit_states(list(batch.states), kv_tokens=batch.kv_tokens)

    def load_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        if not isinstance(named_tensors, Mapping):
            raise RolloutError(f"named_tensors must be a mapping, got {type(named_tensors).__name__}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise RolloutError(f"version must be an int >= 0, got {version!r}")
        fingerprint, schema = weights_fingerprint(named_tensors)
        with self._lock:
            self._check_open()
            if self._samples:
                raise EngineBusy(f"cannot load weights while {len(self._samples)} samples are admitted")
            if self._schema is not None and schema != self._schema:
                raise RolloutError("weight names or shapes differ from the loaded model's")
            self._schema, self._weights, self._version = schema, fingerprint, version

    def load(self) -> EngineLoad:
        with self._lock:
            self._check_open()
            self._advance()
            schedule = self._schedule
            live = [sid for sid in self._samples if schedule.phase(sid) != DONE]
            return EngineLoad(
                running=schedule.running, queued=schedule.queued,
                queued_tokens=sum(self._samples[sid].state.params.max_new_tokens - schedule.produced(sid)
                                  for sid in live),
                decode_tokens_per_s=schedule.rate, weight_version=self._version)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for sid in list(self._samples):
                self._drop(sid)

    # -- emulation knobs --------------------------------------------------------------------

    def set_speed(self, factor: float) -> None:
        """Scale every rate by factor from now on (a throttled or noisy-neighbour GPU)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        with self._lock:
            self._check_open()
            self._advance()
            self._schedule.set_speed(factor)
