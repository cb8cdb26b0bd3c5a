"""Handoff of in-flight samples between two rollout engines: drain them from the source
(export their states, with KV pages or not), ship the packed batch as bytes (in-process,
or over rlboost.transfer between processes, see rollout.handoff.tickets), and resume them on the
destination. A refused or failed handoff never loses a sample.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, Sequence

import numpy as np

from rlboost.errors import HandoffFailed, RolloutError, TransferTimeout
from rlboost.migration.batch import pack_batch, unpack_batch
from rlboost.rollout.engine import RolloutEngine
from rlboost.rollout.handoff.result import (
    HANDOFF_FORMAT_VERSION,
    MODES,
    HandoffResult,
    batch_counts,
    check_mode,
    drain,
    give_back,
    make_result,
)
from rlboost.rollout.handoff.tickets import (
    DEFAULT_TIMEOUT_S,
    HandoffTicket,
    SampleReceiver,
    SampleSender,
    TransferChannel,
)

__all__ = ["HANDOFF_FORMAT_VERSION", "MODES", "Channel", "Handoff", "HandoffResult", "HandoffTicket",
           "InProcessChannel", "SampleReceiver", "SampleSender", "TransferChannel", "batch_counts", "drain",
           "give_back", "migrate"]


class Channel(Protocol):
    """Moves one packed batch from the source side to the destination side."""

    def ship(self, payload: bytes, timeout: float | None = None):
        """Return a buffer holding `payload` on the receiving side (anything unpack_batch takes)."""


class InProcessChannel:
    """Both engines live in this process: the packed bytes are handed over, not sent.

    Packing still runs, so a batch crosses the same codec (and checks) as over a network.
    unpack_batch copies each sample's KV out of read-only bytes; once those copies outgrow
    the allocator's recycled heap (glibc: 32 MiB) every one lands in fresh 4 KiB pages,
    whose first-touch faults cost ~5x a copy. Large payloads are therefore copied once
    into a numpy buffer (numpy asks for transparent huge pages) and unpacked as views.
    """

    LARGE_PAYLOAD = 32 << 20

    def ship(self, payload: bytes, timeout: float | None = None):
        if len(payload) < self.LARGE_PAYLOAD:
            return payload
        return np.frombuffer(payload, dtype=np.uint8).copy()


def _check_kv_compatible(src: RolloutEngine, dst: RolloutEngine) -> None:
    """Refuse a KV handoff up front, before anything is drained, when the pages cannot fit."""
    ours, theirs = getattr(src, "kv_layout", None), getattr(dst, "kv_layout", None)
    if ours is None or theirs is None:
        return  # an engine that does not say: its import_states is the judge
    if not ours.compatible_with(theirs):
        raise RolloutError(f"KV pages cannot move: source layout {ours}, destination {theirs}; "
                           "use mode='tokens'")


class Handoff:
    """Moves samples from `src` to `dst` (both in this process): drain -> ship -> resume.

        h = Handoff(src, dst, [3, 7], mode="kv").prepare().start()
        result = h.wait(timeout=10.0)       # HandoffResult, or HandoffFailed

    prepare() checks the mode and that KV pages fit the destination, before anything
    moves. If the destination refuses the samples (RolloutError) or shipping fails, they
    are resumed on the source (on_refused="return", the default) or left to the caller
    (on_refused="raise"); either way HandoffFailed is raised with the drained batch.
    Shipping is bounded by ship_timeout_s (None: unbounded), so a stalled channel ends in
    TransferTimeout, and the samples go back, instead of a handoff that never ends.
    """

    def __init__(self, src: RolloutEngine, dst: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv",
                 *, channel: Channel | None = None, on_refused: str = "return",
                 ship_timeout_s: float | None = DEFAULT_TIMEOUT_S):
        check_mode(mode)
        if on_refused not in ("return", "raise"):
            raise ValueError(f"on_refused must be 'return' or 'raise', got {on_refused!r}")
        if ship_timeout_s is not None and not ship_timeout_s > 0:
            raise ValueError(f"ship_timeout_s must be > 0 or None, got {ship_timeout_s}")
        if src is dst:
            raise ValueError("source and destination are the same engine")
        self.src, self.dst, self.mode = src, dst, mode
        self.sample_ids = list(sample_ids)
        self.channel = channel if channel is not None else InProcessChannel()
        self.on_refused = on_refused
        self.ship_timeout_s = ship_timeout_s
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
            return make_result(self.mode, batch, 0, t1 - t0, 0.0, 0.0, 0.0, 0.0)
        try:
            payload = pack_batch(batch)
            t2 = time.perf_counter()
            received = self.channel.ship(payload, self.ship_timeout_s)
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
        return make_result(self.mode, batch, len(payload), t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)

    def _run_to_event(self) -> None:
        try:
            self._result = self.run()
        except BaseException as exc:  # handed to wait(), which re-raises it
            self._error = exc
        finally:
            self._done.set()


def migrate(src: RolloutEngine, dst: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv", *,
            channel: Channel | None = None, on_refused: str = "return",
            ship_timeout_s: float | None = DEFAULT_TIMEOUT_S) -> HandoffResult:
    """Move samples from src to dst in one call (see Handoff)."""
    return Handoff(src, dst, sample_ids, mode, channel=channel, on_refused=on_refused,
                   ship_timeout_s=ship_timeout_s).prepare().run()
