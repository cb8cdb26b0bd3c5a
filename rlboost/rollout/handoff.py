"""Handoff of in-flight samples between two rollout engines: drain them from the source
(export their states, with KV pages or not), ship the packed batch as bytes, and resume
them on the destination. A refused or failed handoff never loses a sample.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from rlboost.errors import HandoffFailed, RolloutError, TransferTimeout
from rlboost.migration.batch import MigrationBatch, pack_batch, unpack_batch
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import RolloutEngine

__all__ = ["HANDOFF_FORMAT_VERSION", "MODES", "Channel", "Handoff", "HandoffResult", "InProcessChannel",
           "migrate"]

HANDOFF_FORMAT_VERSION = 1
MODES = ("tokens", "kv")  # tokens: the destination re-prefills; kv: KV pages travel along


@dataclass(frozen=True, kw_only=True, slots=True)
class HandoffResult:
    """What one handoff moved, and how long each phase took (seconds).

    >>> r = HandoffResult(mode="kv", states=(), samples_moved=2, tokens_moved=300, kv_bytes=153600,
    ...                   batch_bytes=155000, reprefill_tokens=0, drain_s=0.001, pack_s=0.0002,
    ...                   ship_s=0.0001, unpack_s=0.0001, resume_s=0.0005)
    >>> r.samples_moved, r.kv_bytes, round(r.total_s, 4)
    (2, 153600, 0.0019)

    states: the moved samples as drained, holding every token generated on the source
    (polled or not): a collector resets its view of these samples to them, because the
    source emits no further delta for them and the destination continues after them.
    tokens_moved: prompt + output tokens of the moved samples. kv_bytes: KV page bytes in
    the shipped batch; batch_bytes: the whole packed batch. reprefill_tokens: positions
    whose K/V the destination computes before its next token, beyond the one last token
    every resumed sample feeds (tokens mode: position - 1 per sample; kv mode: normally 0).
    """

    mode: str
    states: tuple[RequestState, ...]
    samples_moved: int
    tokens_moved: int
    kv_bytes: int
    batch_bytes: int
    reprefill_tokens: int
    drain_s: float
    pack_s: float
    ship_s: float
    unpack_s: float
    resume_s: float
    format_version: int = HANDOFF_FORMAT_VERSION

    @property
    def total_s(self) -> float:
        return self.drain_s + self.pack_s + self.ship_s + self.unpack_s + self.resume_s

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(s.sample_id for s in self.states)


class Channel(Protocol):
    """Moves one packed batch from the source side to the destination side."""

    def ship(self, payload: bytes, timeout: float | None = None):
        """Return a buffer holding `payload` on the receiving side (anything unpack_batch takes)."""


class InProcessChannel:
    """Both engines live in this process: the packed bytes are copied once into a receive
    buffer, as a network would deliver them, and unpacked from there without a copy.

    Packing still runs, so a batch crosses the same codec (and checks) as over a network.
    The copy is what makes KV pages zero-copy views: unpacking read-only bytes would copy
    each sample into small fresh buffers, whose 4 KiB first-touch page faults cost ~5x
    more than one copy into a numpy buffer (numpy asks for transparent huge pages).
    """

    def ship(self, payload: bytes, timeout: float | None = None) -> np.ndarray:
        return np.frombuffer(payload, dtype=np.uint8).copy()


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _check_kv_compatible(src: RolloutEngine, dst: RolloutEngine) -> None:
    """Refuse a KV handoff up front, before anything is drained, when the pages cannot fit."""
    ours, theirs = getattr(src, "kv_layout", None), getattr(dst, "kv_layout", None)
    if ours is None or theirs is None:
        return  # an engine that does not say: its import_states is the judge
    for name in ("num_layers", "num_kv_heads", "head_dim", "dtype"):
        if getattr(ours, name) != getattr(theirs, name):
            raise RolloutError(f"KV pages cannot move: source has {name}={getattr(ours, name)!r}, "
                               f"destination {getattr(theirs, name)!r}; use mode='tokens'")


def drain(src: RolloutEngine, sample_ids: Sequence[int], mode: str) -> MigrationBatch:
    """Remove the samples from the source and return their states (and KV pages in kv mode).

    Unknown and finished ids are skipped (the engine's export contract)."""
    _check_mode(mode)
    return src.export_states(list(sample_ids), with_kv=mode == "kv")


def batch_counts(batch: MigrationBatch) -> dict[str, int]:
    """samples_moved, tokens_moved, kv_bytes and reprefill_tokens of a drained batch."""
    kv_tokens = batch.kv_tokens if batch.has_kv else (0,) * len(batch.states)
    reprefill = sum(max(0, s.position - 1 - min(t, s.position - 1)) for s, t in zip(batch.states, kv_tokens))
    kv_bytes = sum(d.numel() for d in batch.kv_data) if batch.has_kv else 0
    return {"samples_moved": len(batch.states), "tokens_moved": sum(s.position for s in batch.states),
            "kv_bytes": kv_bytes, "reprefill_tokens": reprefill}


def give_back(src: RolloutEngine, batch: MigrationBatch, why: BaseException, where: str) -> HandoffFailed:
    """Resume a drained batch on its source; return the error to raise either way."""
    ids = list(batch.sample_ids)
    try:
        src.import_states(batch)
    except Exception as again:
        err = HandoffFailed(f"{where} failed ({why}); the source refused the samples back too ({again}): "
                            f"samples {ids[:8]} are only in this error's batch", batch=batch)
        err.__cause__ = why
        return err
    err = HandoffFailed(f"{where} failed ({why}); samples {ids[:8]} resumed on the source",
                        batch=batch, returned_to_source=True)
    err.__cause__ = why
    return err


class Handoff:
    """Moves samples from `src` to `dst` (both in this process): drain -> ship -> resume.

        h = Handoff(src, dst, [3, 7], mode="kv").prepare().start()
        result = h.wait(timeout=10.0)       # HandoffResult, or HandoffFailed

    prepare() checks the mode and that KV pages fit the destination, before anything
    moves. If the destination refuses the samples (RolloutError) or shipping fails, they
    are resumed on the source (on_refused="return", the default) or left to the caller
    (on_refused="raise"); either way HandoffFailed is raised with the drained batch.
    """

    def __init__(self, src: RolloutEngine, dst: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv",
                 *, channel: Channel | None = None, on_refused: str = "return"):
        _check_mode(mode)
        if on_refused not in ("return", "raise"):
            raise ValueError(f"on_refused must be 'return' or 'raise', got {on_refused!r}")
        if src is dst:
            raise ValueError("source and destination are the same engine")
        self.src, self.dst, self.mode = src, dst, mode
        self.sample_ids = list(sample_ids)
        self.channel = channel if channel is not None else InProcessChannel()
        self.on_refused = on_refused
        self._prepared = False
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._result: HandoffResult | None = None
        self._error: BaseException | None = None

    def prepare(self) -> Handoff:
        if self.mode == "kv":
            _check_kv_compatible(self.src, self.dst)
        self._prepared = True
        return self

    def start(self) -> Handoff:
        """Run the handoff on a background thread and return at once."""
        if self._thread is not None:
            raise ValueError("handoff already started")
        if not self._prepared:
            self.prepare()
        self._thread = threading.Thread(target=self._run_to_event, name="rlboost-handoff", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> HandoffResult:
        """The result once done. TransferTimeout after `timeout` s (the handoff keeps going)."""
        if self._thread is None:
            self.start()
        if not self._done.wait(timeout):
            raise TransferTimeout(f"handoff of {len(self.sample_ids)} samples not done after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def run(self) -> HandoffResult:
        """The whole handoff on the calling thread."""
        if not self._prepared:
            self.prepare()
        t0 = time.perf_counter()
        batch = drain(self.src, self.sample_ids, self.mode)
        t1 = time.perf_counter()
        if not batch.states:
            return _result(self.mode, batch, 0, t1 - t0, 0.0, 0.0, 0.0, 0.0)
        try:
            payload = pack_batch(batch)
            t2 = time.perf_counter()
            received = self.channel.ship(payload)
            t3 = time.perf_counter()
            arrived = unpack_batch(received)
            t4 = time.perf_counter()
            self.dst.import_states(arrived)
            t5 = time.perf_counter()
        except Exception as exc:
            if self.on_refused == "return":
                raise give_back(self.src, batch, exc, "handoff") from exc
            raise HandoffFailed(f"handoff failed ({exc}); samples {list(batch.sample_ids)[:8]} are only in "
                                "this error's batch", batch=batch) from exc
        return _result(self.mode, batch, len(payload), t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)

    def _run_to_event(self) -> None:
        try:
            self._result = self.run()
        except BaseException as exc:  # handed to wait(), which re-raises it
            self._error = exc
        finally:
            self._done.set()


def _result(mode: str, batch: MigrationBatch, batch_bytes: int, drain_s: float, pack_s: float,
            ship_s: float, unpack_s: float, resume_s: float) -> HandoffResult:
    return HandoffResult(mode=mode, states=tuple(batch.states), batch_bytes=batch_bytes, drain_s=drain_s,
                         pack_s=pack_s, ship_s=ship_s, unpack_s=unpack_s, resume_s=resume_s,
                         **batch_counts(batch))


def migrate(src: RolloutEngine, dst: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv", *,
            channel: Channel | None = None, on_refused: str = "return") -> HandoffResult:
    """Move samples from src to dst in one call (see Handoff)."""
    return Handoff(src, dst, sample_ids, mode, channel=channel, on_refused=on_refused).prepare().run()
