"""EmulatedEngine: a RolloutEngine that takes the time a configured GPU would, with deterministic tokens.

Token t of a sample is a hash of (weights, prompt, seed, sample_id, t) (greedy samples:
of weights, prompt and t only); an end-of-sequence token appears with a set probability
drawn from the same hash, so lengths vary when it is a stop token, yet never depend on
which engine, or how many, generated the sample. Time comes from an injectable clock.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from rlboost.errors import RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.kv import KVLayout
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import EngineLoad, TokenDelta

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# Emulated KV pages: per cached position, its token id and its position as two int32 values
# (8 bytes = 1 layer x (K, V) x 1 head x 1 dim x float32), so an importer can check them.
KV_LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, block_size=16, dtype="float32")


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finalizer; uint64 array arithmetic wraps modulo 2**64 as intended
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _digest(*parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return int.from_bytes(h.digest(), "little")


def sample_key(weights: int, state: RequestState) -> int:
    """What a sample's tokens depend on: weights and prompt, plus seed and id unless greedy."""
    prompt = np.asarray(state.prompt_ids, dtype=np.int64).tobytes()
    if state.params.temperature == 0.0:
        return _digest(weights.to_bytes(8, "little"), prompt)
    return _digest(weights.to_bytes(8, "little"), prompt, (state.seed & _MASK).to_bytes(8, "little"),
                   state.sample_id.to_bytes(8, "little"))


def emulated_tokens(key: int, start: int, stop: int, *, vocab_size: int, eos_token_id: int,
                    eos_probability: float) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens start..stop-1 of the sample with this key, and their logprobs (float32).

    >>> ids, lp = emulated_tokens(7, 0, 4, vocab_size=100, eos_token_id=2, eos_probability=1.0)
    >>> ids.tolist(), bool((lp <= 0).all())
    ([2, 2, 2, 2], True)
    """
    t = np.arange(start, stop, dtype=np.uint64)
    h = _mix(t * np.uint64(_GOLDEN) + np.uint64(key))
    eos = (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < eos_probability
    h2 = _mix(h ^ np.uint64(0xD6E8FEB86659FD93))
    ids = (h2 % np.uint64(vocab_size)).astype(np.int64)
    ids[eos] = eos_token_id
    logprobs = (-(h2 >> np.uint64(40)).astype(np.float64) * (8.0 / 2 ** 24)).astype(np.float32)
    return ids, logprobs


def weights_fingerprint(named_tensors: Mapping[str, Any]) -> tuple[int, dict[str, tuple]]:
    """A hash standing for the weights' values, and their schema (name -> shape, dtype).

    Only the first and last 64 KiB of each tensor enter the hash: enough to tell versions
    apart in emulation without reading gigabytes.
    """
    parts, schema = [], {}
    for name in sorted(named_tensors):
        value = named_tensors[name]
        if hasattr(value, "detach"):  # a torch tensor
            import torch

            value = value.detach().cpu().contiguous()
            schema[name] = (tuple(value.shape), str(value.dtype))
            raw = value.reshape(-1).view(torch.uint8).numpy()
        else:
            arr = np.ascontiguousarray(np.asarray(value))
            schema[name] = (tuple(arr.shape), str(arr.dtype))
            raw = arr.reshape(-1).view(np.uint8)
        parts += [name.encode(), repr(schema[name]).encode(), raw[:65536].tobytes(), raw[-65536:].tobytes()]
    return _digest(*parts), schema


@dataclass(kw_only=True, slots=True)
class EmulatedEngineConfig:
    """Speeds and token statistics of an emulated engine.

    decode_tokens_per_s caps the engine's aggregate decode rate; sample_tokens_per_s caps
    each sample's rate (so with k samples each decodes at min(sample, aggregate / k)).
    Each token is eos_token_id with probability stop_probability; a sample stops there
    when eos_token_id is among its stop_token_ids (as a trainer sets it).
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
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(f"eos_token_id must be in [0, vocab_size), got {self.eos_token_id}")


class _RealClock:
    virtual = False

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class _Sample:
    __slots__ = ("state", "ids", "logprobs", "length", "finish_reason", "base", "polled",
                 "prefill", "v_start", "phase", "serial")

    def __init__(self, state: RequestState, config: EmulatedEngineConfig, weights: int, prefill: float,
                 serial: int):
        params = state.params
        self.state = state
        self.base = len(state.output_ids)
        self.ids, self.logprobs = emulated_tokens(
            sample_key(weights, state), self.base, params.max_new_tokens, vocab_size=config.vocab_size,
            eos_token_id=config.eos_token_id, eos_probability=config.stop_probability)
        hits = np.flatnonzero(np.isin(self.ids, params.stop_token_ids)) if params.stop_token_ids else []
        if len(hits):
            self.length, self.finish_reason = self.base + int(hits[0]) + 1, "stop"
        else:
            self.length, self.finish_reason = params.max_new_tokens, "length"
        self.polled = self.base        # output index of the next token a delta will report
        self.prefill = prefill         # prompt + output tokens still to prefill
        self.v_start = 0.0
        self.phase = "waiting"         # waiting -> prefill -> decode -> done
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
        return self.state.extended(tuple(self.ids[:n].tolist()), tuple(self.logprobs[:n].tolist()))


def _kv_pages(state: RequestState):
    """Emulated pages of every position but the last (which has not been fed yet)."""
    import torch

    seq = np.asarray(state.prompt_ids + state.output_ids, dtype=np.int32)[:-1]
    pages = np.stack([seq, np.arange(len(seq), dtype=np.int32)], axis=1)
    return len(seq), torch.from_numpy(pages.reshape(-1).view(np.uint8).copy())


def _check_kv_pages(state: RequestState, tokens: int, data) -> None:
    seq = np.asarray(state.prompt_ids + state.output_ids, dtype=np.int32)[:tokens]
    pages = data.cpu().numpy().view(np.int32).reshape(-1, 2)
    if not (np.array_equal(pages[:, 0], seq) and np.array_equal(pages[:, 1], np.arange(tokens))):
        raise RolloutError(f"KV pages of sample {state.sample_id} do not match its tokens")


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

    Decode: k decoding samples each advance at min(sample_tokens_per_s, decode_tokens_per_s / k);
    prefill runs one sample at a time at prefill_tokens_per_s beside decode. Its KV pages are
    stand-ins (each cached position's token id and index, layout KV_LAYOUT): they travel and
    are checked like real ones, and an import with pages spares the prefill they stand for.
    top_k and top_p do not change the emulated tokens. The clock is any object with now(),
    a `virtual` flag and, unless virtual, sleep(s); by default the monotonic clock.
    One caller at a time is expected (as a Ray actor has).
    """

    def __init__(self, config: EmulatedEngineConfig | None = None, *, clock: Any = None):
        self.config = config or EmulatedEngineConfig()
        self.clock = clock if clock is not None else _RealClock()
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
        self._weights = 0
        self._schema: dict[str, tuple] | None = None
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
        self._admit_states(list(states), kv_tokens=None)

    def _validate(self, states: list) -> None:
        seen = set()
        vocab = self.config.vocab_size
        for st in states:
            if not isinstance(st, RequestState):
                raise RolloutError(f"submit takes RequestState records, got {type(st).__name__}")
            if st.weight_version != self._version:
                raise RolloutError(f"sample {st.sample_id} wants weight version {st.weight_version}, "
                                   f"engine holds {self._version}")
            if st.finished or st.remaining_tokens < 1:
                raise RolloutError(f"sample {st.sample_id} has nothing left to generate")
            if st.sample_id in self._samples or st.sample_id in seen:
                raise RolloutError(f"sample {st.sample_id} is already admitted")
            if any(not 0 <= t < vocab for t in st.prompt_ids + st.output_ids):
                raise RolloutError(f"sample {st.sample_id} holds token ids outside [0, {vocab})")
            seen.add(st.sample_id)

    def _admit_states(self, states: list, kv_tokens: Sequence[int] | None) -> None:
        with self._lock:
            self._check_open()
            self._validate(states)  # all or nothing: a refused batch admits no sample
            self._advance()
            for i, st in enumerate(states):
                cached = kv_tokens[i] if kv_tokens is not None else 0
                self._serial += 1
                self._samples[st.sample_id] = _Sample(st, self.config, self._weights,
                                                      prefill=float(max(1, st.position - cached)),
                                                      serial=self._serial)
                self._waiting.append(st.sample_id)
            self._admit()

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
        k = len(self._decoding)
        wait = 1.0 / self._sample_rate(k) if k else math.inf
        head = self._head(self._prefilling, "prefill")
        if head is not None:  # a sample about to start decoding
            wait = min(wait, head.prefill / (self.config.prefill_tokens_per_s * self._speed) + 1e-3)
        return wait

    def _collect(self) -> list[TokenDelta]:
        out: list[TokenDelta] = []
        finished = []
        for sid, s in self._samples.items():
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
            ids = list(self._samples) if sample_ids is None else list(dict.fromkeys(sample_ids))
            # finished samples stay: their last delta is still due to the next poll
            ids = [i for i in ids if i in self._samples and self._samples[i].phase != "done"]
            states = []
            for sid in ids:
                s = self._samples[sid]
                states.append(s.export(s.produced(self._v)))
                self._drop(sid)
            self._admit()
        if not with_kv:
            return MigrationBatch(states=tuple(states))
        pages = [_kv_pages(st) for st in states]
        return MigrationBatch(states=tuple(states), kv_layout=KV_LAYOUT, kv_tokens=tuple(n for n, _ in pages),
                              kv_data=tuple(d for _, d in pages))

    def import_states(self, batch: MigrationBatch) -> None:
        if batch.kv_layout is None:
            self._admit_states(list(batch.states), kv_tokens=None)
            return
        if batch.kv_layout != KV_LAYOUT:
            raise RolloutError(f"KV pages in layout {batch.kv_layout} cannot be used here (needs {KV_LAYOUT})")
        for st, n, data in zip(batch.states, batch.kv_tokens, batch.kv_data):
            _check_kv_pages(st, n, data)
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
                raise RolloutError(f"cannot load weights while {len(self._samples)} samples are admitted")
            if self._schema is not None and schema != self._schema:
                raise RolloutError("weight names or shapes differ from the loaded model's")
            self._schema, self._weights, self._version = schema, fingerprint, version

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
