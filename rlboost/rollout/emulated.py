"""EmulatedEngine: a RolloutEngine that takes the time a configured GPU would, with deterministic tokens.

Token t of a sample is a hash of (seed, sample_id, t); a stop token appears with a set
probability drawn from the same hash, so lengths vary yet never depend on which engine, or
how many, generated the sample. Time comes from an injectable clock (virtual in tests).
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from rlboost.controller.clock import Clock, MonotonicClock
from rlboost.errors import RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import EngineLoad, TokenDelta

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix_int(x: int) -> int:
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finalizer; uint64 array arithmetic wraps modulo 2**64 as intended
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def emulated_tokens(seed: int, sample_id: int, start: int, stop: int, *, vocab_size: int,
                    stop_probability: float, stop_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens start..stop-1 of a sample, and their logprobs (float32).

    >>> ids, lp = emulated_tokens(1, 7, 0, 4, vocab_size=100, stop_probability=0.0, stop_ids=(2,))
    >>> len(ids), bool((ids != 2).all()), lp.dtype.name
    (4, True, 'float32')
    """
    key = _mix_int(_mix_int(seed) ^ _mix_int(sample_id + _GOLDEN))
    t = np.arange(start, stop, dtype=np.uint64)
    h = _mix(t * np.uint64(_GOLDEN) + np.uint64(key))
    stops = (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < stop_probability
    h2 = _mix(h ^ np.uint64(0xD6E8FEB86659FD93))
    inside = sorted({s for s in stop_ids if 0 <= s < vocab_size})
    ids = (h2 % np.uint64(vocab_size - len(inside))).astype(np.int64)
    for s in inside:  # map onto the vocabulary minus the stop ids, in increasing order
        ids += ids >= s
    ids[stops] = stop_ids[0]
    logprobs = (-(h2 >> np.uint64(40)).astype(np.float64) * (8.0 / 2 ** 24)).astype(np.float32)
    return ids, logprobs


@dataclass(kw_only=True, slots=True)
class EmulatedEngineConfig:
    """Speeds and token statistics of an emulated engine.

    decode_tokens_per_s caps the engine's aggregate decode rate; sample_tokens_per_s caps
    each sample's rate (so with k samples each decodes at min(sample, aggregate / k)).
    """

    decode_tokens_per_s: float = 2000.0
    sample_tokens_per_s: float = 50.0
    prefill_tokens_per_s: float = 20000.0
    max_running: int = 64
    vocab_size: int = 32000
    stop_probability: float = 0.01
    eos_token_id: int = 2
    rate_window_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("decode_tokens_per_s", "sample_tokens_per_s", "prefill_tokens_per_s",
                     "rate_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if not 0.0 <= self.stop_probability <= 1.0:
            raise ValueError(f"stop_probability must be in [0, 1], got {self.stop_probability}")
        if self.eos_token_id < 0:
            raise ValueError(f"eos_token_id must be >= 0, got {self.eos_token_id}")


class _Sample:
    __slots__ = ("state", "ids", "logprobs", "length", "finish_reason", "base", "polled",
                 "prefill", "v_start", "phase", "tagged", "serial")

    def __init__(self, state: RequestState, config: EmulatedEngineConfig, prefill: float, serial: int):
        params = state.params
        stop_ids = tuple(params.stop_token_ids) or (config.eos_token_id,)
        self.state = state
        self.base = len(state.output_ids)
        self.ids, self.logprobs = emulated_tokens(
            state.seed, state.sample_id, self.base, params.max_new_tokens,
            vocab_size=config.vocab_size, stop_probability=config.stop_probability, stop_ids=stop_ids)
        hits = np.flatnonzero(np.isin(self.ids, stop_ids))
        if hits.size:
            self.length, self.finish_reason = self.base + int(hits[0]) + 1, "stop"
        else:
            self.length, self.finish_reason = params.max_new_tokens, "length"
        self.polled = self.base        # output index of the next token a delta will report
        self.prefill = prefill         # prompt + output tokens still to prefill
        self.v_start = 0.0
        self.phase = "waiting"         # waiting -> prefill -> decode -> done
        self.tagged: list[TokenDelta] = []  # deltas cut at a weight change, not yet polled
        self.serial = serial           # tells a resubmitted sample from its earlier admission

    def produced(self, v: float) -> int:
        """Output tokens generated by decode-clock value v (the last one only once done)."""
        if self.phase == "done":
            return self.length
        if self.phase != "decode":
            return self.base
        return self.base + min(self.length - self.base - 1, int(math.floor(v - self.v_start + 1e-6)))

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
        return self.state.extended(tuple(self.ids[:n].tolist()), tuple(self.logprobs[:n].tolist()),
                                   self.finish_reason if upto == self.length else None)


class EmulatedEngine:
    """A RolloutEngine whose timing follows a configured GPU and whose tokens are a hash.

    >>> from rlboost.controller.clock import ManualClock
    >>> from rlboost.migration.state import SamplingParams
    >>> clock = ManualClock()
    >>> eng = EmulatedEngine(EmulatedEngineConfig(sample_tokens_per_s=10.0, stop_probability=0.0), clock=clock)
    >>> eng.load_weights({}, version=0)
    >>> eng.submit([RequestState(sample_id=1, prompt_ids=(1,), params=SamplingParams(max_new_tokens=5),
    ...                          seed=0, weight_version=0)])
    >>> clock.advance(0.35)
    >>> [len(d.ids) for d in eng.poll(0.0)]
    [3]

    Decode: k decoding samples each advance at min(sample_tokens_per_s, decode_tokens_per_s / k);
    prefill runs one sample at a time at prefill_tokens_per_s beside decode. It holds no real
    KV cache: export_states(with_kv=True) returns states only, and imported KV pages spare
    the prefill time they stand for. One caller at a time is expected (as a Ray actor has).
    """

    def __init__(self, config: EmulatedEngineConfig | None = None, *, clock: Clock | None = None):
        self.config = config or EmulatedEngineConfig()
        self.clock = clock or MonotonicClock()
        self._lock = threading.RLock()
        self._t = self.clock.now()
        self._v = 0.0  # decode clock: tokens every decoding sample has advanced since creation
        self._samples: dict[int, _Sample] = {}
        self._waiting: deque[int] = deque()
        self._prefilling: deque[int] = deque()
        self._decoding: set[int] = set()
        self._heap: list[tuple[float, int, int]] = []  # (finish on the decode clock, serial, id)
        self._serial = 0
        self._version = -1
        self._speed = 1.0
        self._rate = 0.0
        self._closed = False

    # -- time model -------------------------------------------------------------------------

    def _sample_rate(self, k: int) -> float:
        cfg = self.config
        return min(cfg.sample_tokens_per_s, cfg.decode_tokens_per_s / k) * self._speed if k else 0.0

    def _head(self, queue: deque[int], phase: str) -> _Sample | None:
        while queue:
            s = self._samples.get(queue[0])
            if s is not None and s.phase == phase:
                return s
            queue.popleft()  # aborted or exported meanwhile
        return None

    def _admit(self) -> None:
        while len(self._decoding) + len(self._prefilling) < self.config.max_running:
            s = self._head(self._waiting, "waiting")
            if s is None:
                return
            self._waiting.popleft()
            s.phase = "prefill"
            self._prefilling.append(s.state.sample_id)

    def _advance(self) -> None:
        to = max(self._t, self.clock.now())
        prefill_rate = self.config.prefill_tokens_per_s * self._speed
        while True:
            k = len(self._decoding)
            r = self._sample_rate(k)
            while self._heap and not self._valid(self._heap[0]):
                heapq.heappop(self._heap)
            head = self._head(self._prefilling, "prefill")
            dt = to - self._t
            if k:
                dt = min(dt, max(0.0, (self._heap[0][0] - self._v) / r))
            if head is not None:
                dt = min(dt, max(0.0, head.prefill / prefill_rate))
            self._v += r * dt
            if head is not None:
                head.prefill -= prefill_rate * dt
            if dt > 0:
                self._rate += (r * k - self._rate) * (1.0 - math.exp(-dt / self.config.rate_window_s))
            self._t += dt
            if not self._events(head) and self._t >= to:
                return

    def _events(self, head: _Sample | None) -> bool:
        happened = False
        while self._heap and self._heap[0][0] <= self._v + 1e-9:
            entry = heapq.heappop(self._heap)
            sid = entry[2]
            if self._valid(entry):
                self._decoding.discard(sid)
                self._samples[sid].phase = "done"
                happened = True
        if head is not None and head.prefill <= 1e-9:
            self._prefilling.popleft()
            head.phase, head.v_start = "decode", self._v
            self._decoding.add(head.state.sample_id)
            heapq.heappush(self._heap, (self._v + head.length - head.base, head.serial, head.state.sample_id))
            happened = True
        if happened:
            self._admit()
        return happened

    def _valid(self, entry: tuple[float, int, int]) -> bool:
        s = self._samples.get(entry[2])
        return s is not None and s.serial == entry[1] and s.phase == "decode"

    def _drop(self, sid: int) -> _Sample | None:
        s = self._samples.pop(sid, None)
        if s is not None:
            self._decoding.discard(sid)
            if s.phase == "prefill":
                self._prefilling.remove(sid)
            s.phase = "gone"
        return s

    def _check_open(self) -> None:
        if self._closed:
            raise RolloutError("emulated engine is closed")

    # -- RolloutEngine protocol -------------------------------------------------------------

    def submit(self, states: Sequence[RequestState]) -> None:
        self._admit_states(states, kv_tokens=None)

    def _admit_states(self, states: Sequence[RequestState], kv_tokens: Sequence[int] | None) -> None:
        with self._lock:
            self._check_open()
            seen = set()
            for st in states:
                if st.weight_version != self._version:
                    raise RolloutError(f"sample {st.sample_id} wants weight version {st.weight_version}, "
                                       f"engine holds {self._version}")
                if st.finished or st.remaining_tokens < 1:
                    raise RolloutError(f"sample {st.sample_id} has nothing left to generate")
                if st.sample_id in self._samples or st.sample_id in seen:
                    raise RolloutError(f"sample {st.sample_id} is already admitted")
                seen.add(st.sample_id)
            self._advance()
            for i, st in enumerate(states):
                cached = kv_tokens[i] if kv_tokens is not None else 0
                self._serial += 1
                s = _Sample(st, self.config, prefill=float(max(1, st.position - cached)), serial=self._serial)
                self._samples[st.sample_id] = s
                self._waiting.append(st.sample_id)
            self._admit()

    def poll(self, timeout_s: float) -> list[TokenDelta]:
        deadline = self.clock.now() + max(0.0, timeout_s)
        while True:
            with self._lock:
                self._check_open()
                self._advance()
                deltas = self._collect()
                wait = self._next_event_in()
            now = self.clock.now()
            if deltas or self.clock.virtual or now >= deadline:
                return deltas
            self.clock.sleep(max(1e-4, min(deadline - now, wait)))

    def _next_event_in(self) -> float:
        k = len(self._decoding)
        return 1.0 / self._sample_rate(k) if k else math.inf

    def _collect(self) -> list[TokenDelta]:
        out: list[TokenDelta] = []
        finished = []
        for sid, s in self._samples.items():
            out.extend(s.tagged)
            s.tagged.clear()
            d = s.delta(s.produced(self._v), self._version)
            if d is not None:
                out.append(d)
            if s.phase == "done" and s.polled == s.length:
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
            self._admit()

    def export_states(self, sample_ids: Sequence[int] | None = None, *, with_kv: bool = False) -> MigrationBatch:
        with self._lock:
            self._check_open()
            self._advance()
            ids = list(self._samples) if sample_ids is None else [i for i in sample_ids if i in self._samples]
            states = []
            for sid in ids:
                s = self._samples[sid]
                states.append(s.export(s.produced(self._v)))
                self._drop(sid)
            self._admit()
            return MigrationBatch(states=tuple(states))

    def import_states(self, batch: MigrationBatch) -> None:
        kv = batch.kv_tokens if batch.kv_layout is not None else None
        self._admit_states(batch.states, kv_tokens=kv)

    def load_weights(self, named_tensors: Mapping[str, object], version: int) -> None:
        if not isinstance(named_tensors, Mapping):
            raise TypeError(f"named_tensors must be a mapping, got {type(named_tensors).__name__}")
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        with self._lock:
            self._check_open()
            self._advance()
            for s in self._samples.values():  # tokens made so far keep the old version's tag
                d = s.delta(s.produced(self._v), self._version)
                if d is not None:
                    s.tagged.append(d)
            self._version = int(version)

    def load(self) -> EngineLoad:
        with self._lock:
            self._check_open()
            self._advance()
            live = [s for s in self._samples.values() if s.phase != "done"]
            return EngineLoad(
                running=len(self._decoding) + len(self._prefilling), queued=len(self._waiting),
                queued_tokens=sum(s.state.params.max_new_tokens - s.produced(self._v) for s in live),
                decode_tokens_per_s=self._rate, weight_version=self._version)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._samples.clear()
            self._waiting.clear()
            self._prefilling.clear()
            self._decoding.clear()
            self._heap.clear()

    # -- emulation knobs --------------------------------------------------------------------

    def set_speed(self, factor: float) -> None:
        """Scale every rate by factor from now on (a throttled or noisy-neighbour GPU)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        with self._lock:
            self._check_open()
            self._advance()
            self._speed = float(factor)
