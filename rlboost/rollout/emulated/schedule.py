"""BatchSchedule: when an emulated engine's samples prefill, decode and finish.

Samples wait for one of max_running slots, prefill in batches (every sample admitted while a
prefill batch runs joins the next one), then decode as one batch whose step time the pace gives (fixed rates, or the timing model's roofline, which grows
with the batch's cached tokens). With a KV capacity, a sample is admitted only while the
cache has room (ADMIT_SHARE of it), and when decoding fills the cache the sample with the
fewest output tokens is retracted (its cache freed; it prefills again when readmitted), as
SGLang's scheduler does. The emulated engine adds tokens on top of it; the simulator runs
it bare, so both take the same time for the same work.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from rlboost.rollout.emulated.pace import Pace

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"
ADMIT_SHARE = 0.9  # a sample is admitted while the cache, with it, stays under this share


class _Slot:
    __slots__ = ("sid", "serial", "prompt_len", "base", "length", "prefill", "v_start", "phase")

    def __init__(self, sid: int, serial: int, prompt_len: int, base: int, length: int, prefill: float):
        self.sid, self.serial = sid, serial
        self.prompt_len, self.base, self.length = prompt_len, base, length
        self.prefill = prefill  # seconds of prefill still to run, at speed 1
        self.v_start = 0.0
        self.phase = WAITING


class BatchSchedule:
    """The timing of one engine's samples (ids are the caller's; each is admitted once at a time).

    >>> from rlboost.rollout.emulated.config import EmulatedEngineConfig
    >>> from rlboost.rollout.emulated.pace import FixedPace
    >>> s = BatchSchedule(FixedPace(EmulatedEngineConfig(sample_tokens_per_s=10.0)), max_running=4)
    >>> s.admit(1, prompt_len=2, base=0, length=5, prefill_s=0.0)
    >>> s.advance(0.35), s.produced(1)
    ([], 3)
    >>> s.advance(1.0), s.phase(1)
    ([1], 'done')
    """

    def __init__(self, pace: Pace, max_running: int, *, now: float = 0.0, speed: float = 1.0,
                 rate_window_s: float = 1.0, kv_capacity: float = math.inf):
        self.pace, self.max_running = pace, max_running
        self.kv_capacity = kv_capacity  # cached tokens the engine can hold (prompt + output)
        self.retractions = 0
        self.speed, self.rate_window_s = float(speed), rate_window_s
        self.t = now
        self.rate = 0.0  # decoded tokens/s, a moving average over rate_window_s
        self.decoded = 0.0  # tokens decoded since creation, all samples together
        self._v = 0.0  # decode clock: tokens every decoding sample has advanced
        self._ctx0 = 0.0  # cached tokens of the decoding samples are _ctx0 + len(_decoding) * _v
        self._prefill_ctx = 0.0  # cached tokens of the prefilling samples
        self._slots: dict[int, _Slot] = {}
        self._waiting: deque[int] = deque()
        self._prefilling: deque[int] = deque()  # admitted, waiting for the next prefill batch
        self._batch: list[int] = []  # the prefill batch running now
        self._batch_left = 0.0  # seconds it still takes, at speed 1
        self._decoding: set[int] = set()
        self._heap: list[tuple[float, int, int]] = []  # (finish on the decode clock, serial, id)
        self._serial = 0

    # -- queries -------------------------------------------------------------------------------

    def __contains__(self, sid: int) -> bool:
        return sid in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def ids(self) -> list[int]:
        return list(self._slots)

    def phase(self, sid: int) -> str | None:
        slot = self._slots.get(sid)
        return slot.phase if slot is not None else None

    def produced(self, sid: int) -> int:
        """Output tokens the sample holds now (its last one only once done)."""
        s = self._slots[sid]
        if s.phase == DONE:
            return s.length
        if s.phase != DECODE:
            return s.base
        return s.base + min(s.length - s.base - 1, int(math.floor(self._v - s.v_start + 1e-6)))

    @property
    def running(self) -> int:
        return len(self._decoding) + len(self._prefilling) + len(self._batch)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def context(self) -> float:
        """Cached tokens (prompt + output) of the decoding samples."""
        return self._ctx0 + len(self._decoding) * self._v

    def kv_used(self) -> float:
        """Cached tokens of the decoding and prefilling samples."""
        return self.context() + self._prefill_ctx

    def next_event_at(self) -> float:
        """When the next sample starts decoding or finishes, if nothing changes (inf: never)."""
        at = math.inf
        k = len(self._decoding)
        self._clean()
        if k:
            at = self.t + self.pace.decode_time(k, self.context(), max(0.0, self._heap[0][0] - self._v), self.speed)
        if self._batch or self._prefilling:
            left = self._batch_left if self._batch else self._pending_batch_s()
            at = min(at, self.t + max(0.0, left) / self.speed)
        return at

    def next_token_in(self) -> float:
        """Seconds until some sample has a new token (inf: none is running)."""
        k = len(self._decoding)
        wait = self.pace.decode_time(k, self.context(), 1.0, self.speed) if k else math.inf
        if self._batch or self._prefilling:
            left = self._batch_left if self._batch else self._pending_batch_s()
            wait = min(wait, left / self.speed + 1e-3)
        return wait

    # -- changes -------------------------------------------------------------------------------

    def admit(self, sid: int, *, prompt_len: int, base: int, length: int, prefill_s: float) -> None:
        """A sample with `base` output tokens that will end at `length` (> base) joins the queue."""
        if sid in self._slots:
            raise ValueError(f"sample {sid} is already admitted")
        self._serial += 1
        self._slots[sid] = _Slot(sid, self._serial, prompt_len, base, length, prefill_s)
        self._waiting.append(sid)
        self._fill()

    def drop(self, sid: int) -> None:
        """The sample leaves (finished and collected, aborted or exported)."""
        s = self._slots.pop(sid, None)
        if s is None:
            return
        if s.phase == DECODE:
            self._leave_decode(s)
        elif s.phase == PREFILL:
            if sid in self._batch:
                self._batch.remove(sid)  # the batch takes as long: its work was done
            else:
                self._prefilling.remove(sid)
            self._prefill_ctx -= s.prompt_len + s.base
        elif s.phase == WAITING:
            self._waiting.remove(sid)
        s.phase = "gone"
        self._fill()

    def set_speed(self, factor: float) -> None:
        self.speed = float(factor)

    def advance(self, to: float) -> list[int]:
        """Run until `to`; returns the samples that finished on the way, in order."""
        done: list[int] = []
        to = max(self.t, to)
        pace, speed = self.pace, self.speed
        while True:
            k = len(self._decoding)
            self._clean()
            if not self._batch and self._prefilling:
                self._start_batch()
            batching = bool(self._batch)
            dt, dv = to - self.t, None
            ctx = self.context()
            full = False
            if k:  # up to the next sample's last token, a full cache, or `to`
                need = max(0.0, self._heap[0][0] - self._v)
                room = (self.kv_capacity - self.kv_used()) / k if self.kv_capacity < math.inf and k > 1 else math.inf
                if room < need:
                    need, full = max(0.0, room), True
                t_need = pace.decode_time(k, ctx, need, speed)
                if t_need <= dt:
                    dt, dv = t_need, need
                else:
                    full = False
            if batching and self._batch_left / speed < dt:
                dt, dv, full = max(0.0, self._batch_left / speed), None, False
            if k:
                if dv is None:
                    dv = pace.decode_tokens(k, ctx, dt, speed)
                self._v += dv
                self.decoded += k * dv
            if batching:
                self._batch_left -= dt * speed
            if dt > 0:
                self.rate += (k * (dv or 0.0) / dt - self.rate) * (1.0 - math.exp(-dt / self.rate_window_s))
            self.t += dt
            if full:
                self._retract()
            if not self._events(done) and not full and self.t >= to:
                return done

    # -- internals -----------------------------------------------------------------------------

    def _clean(self) -> None:
        while self._heap and not self._valid(self._heap[0]):
            heapq.heappop(self._heap)

    def _head(self, queue: deque[int], phase: str) -> _Slot | None:
        while queue:
            s = self._slots.get(queue[0])
            if s is not None and s.phase == phase:
                return s
            queue.popleft()
        return None

    def _fill(self) -> None:
        used = None
        while len(self._decoding) + len(self._prefilling) < self.max_running:
            s = self._head(self._waiting, WAITING)
            if s is None:
                return
            if self.kv_capacity < math.inf:
                used = self.kv_used() if used is None else used
                if self.running and used + s.prompt_len + s.base > ADMIT_SHARE * self.kv_capacity:
                    return
                used += s.prompt_len + s.base
            self._waiting.popleft()
            s.phase = PREFILL
            self._prefilling.append(s.sid)
            self._prefill_ctx += s.prompt_len + s.base

    def _events(self, done: list[int]) -> bool:
        happened = False
        while self._heap and self._heap[0][0] <= self._v + 1e-9:
            entry = heapq.heappop(self._heap)
            if self._valid(entry):
                s = self._slots[entry[2]]
                self._leave_decode(s)
                s.phase = DONE
                done.append(s.sid)
                happened = True
        if self._batch and self._batch_left <= 1e-12:
            for sid in self._batch:  # the batch is prefilled: its samples decode from now
                s = self._slots[sid]
                self._prefill_ctx -= s.prompt_len + s.base
                s.phase, s.v_start = DECODE, self._v
                self._decoding.add(sid)
                self._ctx0 += s.prompt_len + s.base - self._v
                heapq.heappush(self._heap, (self._v + s.length - s.base, s.serial, sid))
            self._batch = []
            happened = True
        if happened:
            self._fill()
        return happened

    def _pending_batch_s(self) -> float:
        slots = [self._slots[sid] for sid in self._prefilling if sid in self._slots]
        return self.pace.prefill_batch_time([s.prefill for s in slots], 1.0) if slots else 0.0

    def _start_batch(self) -> None:
        """Every sample waiting for prefill forms the next batch (SGLang prefills admitted
        requests together, up to its token budget)."""
        self._batch = [sid for sid in self._prefilling if self._slots.get(sid) is not None
                       and self._slots[sid].phase == PREFILL]
        self._prefilling.clear()
        self._batch_left = self.pace.prefill_batch_time([self._slots[sid].prefill for sid in self._batch], 1.0)

    def _retract(self) -> None:
        """The cache is full: the decoding sample with the fewest output tokens gives up its
        cache and waits at the front of the queue to prefill again."""
        if len(self._decoding) <= 1:
            return
        sid = min(self._decoding, key=lambda i: (self.produced(i), -i))
        s = self._slots[sid]
        produced = self.produced(sid)
        self._leave_decode(s)
        self._serial += 1
        s.serial, s.base, s.phase = self._serial, produced, WAITING
        s.prefill = self.pace.prefill_time(float(s.prompt_len + produced), 0.0, 1.0)
        self._waiting.appendleft(sid)
        self.retractions += 1

    def _leave_decode(self, s: _Slot) -> None:
        self._decoding.discard(s.sid)
        self._ctx0 -= s.prompt_len + s.base - s.v_start

    def _valid(self, entry: tuple[float, int, int]) -> bool:
        s = self._slots.get(entry[2])
        return s is not None and s.serial == entry[1] and s.phase == DECODE
