"""A handoff between two engines of this process, for tests: the SampleSender and
SampleReceiver the rollout instances use, over the transfer layer on loopback (drain ->
serve -> pull -> resume). A refused or failed handoff never loses a sample: by default
the samples go back to their source.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from rlboost.errors import HandoffFailed, RolloutError, TransferTimeout
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.receiver import SampleReceiver
from rlboost.migration.result import HandoffResult, check_mode, make_result
from rlboost.migration.sender import SampleSender
from rlboost.migration.ticket import DEFAULT_TIMEOUT_S, HandoffTicket
from rlboost.rollout.engine import RolloutEngine
from rlboost.transfer import TransferConfig


def check_kv_compatible(src: RolloutEngine, dst: RolloutEngine) -> None:
    """Refuse a KV handoff up front, before anything is drained, when the pages cannot fit."""
    ours, theirs = getattr(src, "kv_layout", None), getattr(dst, "kv_layout", None)
    if ours is None or theirs is None:
        return  # an engine that does not say: its import_states is the judge
    if not ours.compatible_with(theirs):
        raise RolloutError(f"KV pages cannot move: source layout {ours}, destination {theirs}; use mode='tokens'")


class Handoff:
    """Moves samples from `src` to `dst`: prepare() -> start() -> wait(timeout), or run().

    between(ticket), when given, runs after the source has served the batch and before the
    destination pulls it (a gate, or a failure of the shipment). If the destination refuses
    the samples (RolloutError) or the shipment fails, they resume on the source
    (on_refused="return") or are left to the caller (on_refused="raise"); either way
    HandoffFailed is raised with the drained batch. A pull slower than ship_timeout_s ends
    in TransferTimeout, and the samples go back.
    """

    def __init__(self, src: RolloutEngine, dst: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv", *,
                 config: TransferConfig | None = None, between: Callable[[HandoffTicket], None] | None = None,
                 on_refused: str = "return", ship_timeout_s: float | None = DEFAULT_TIMEOUT_S):
        check_mode(mode)
        if on_refused not in ("return", "raise"):
            raise ValueError(f"on_refused must be 'return' or 'raise', got {on_refused!r}")
        if src is dst:
            raise ValueError("source and destination are the same engine")
        self.src, self.dst, self.mode, self.sample_ids = src, dst, mode, list(sample_ids)
        self.config = config if config is not None else TransferConfig(relay=False)
        self.between, self.on_refused, self.ship_timeout_s = between, on_refused, ship_timeout_s
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._result: HandoffResult | None = None
        self._error: BaseException | None = None

    def prepare(self) -> Handoff:
        if self.mode == "kv":
            check_kv_compatible(self.src, self.dst)
        return self

    def start(self) -> Handoff:
        self._thread = threading.Thread(target=self._run_to_event, daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> HandoffResult:
        if self._thread is None:
            self.prepare().start()
        if not self._done.wait(timeout):
            raise TransferTimeout(f"handoff of {len(self.sample_ids)} samples not done after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _run_to_event(self) -> None:
        try:
            self._result = self.run()
        except BaseException as exc:  # handed to wait(), which re-raises it
            self._error = exc
        finally:
            self._done.set()

    def run(self) -> HandoffResult:
        """The whole handoff on the calling thread."""
        with SampleSender(self.config) as sender, SampleReceiver(self.config) as receiver:
            t0 = time.perf_counter()
            ticket = sender.send(self.src, self.sample_ids, self.mode)
            if not ticket.sample_ids:
                sender.release(ticket)
                return make_result(self.mode, MigrationBatch(states=()), 0, time.perf_counter() - t0, 0, 0, 0, 0)
            try:
                if self.between is not None:
                    self.between(ticket)
                result = receiver.receive(self.dst, ticket, self.ship_timeout_s)
            except Exception as exc:
                raise self._failed(sender, ticket, exc) from exc
            sender.release(ticket)
            return result

    def _failed(self, sender: SampleSender, ticket: HandoffTicket, why: Exception) -> HandoffFailed:
        ids = list(ticket.sample_ids)
        if self.on_refused == "raise":
            batch = why.batch if isinstance(why, HandoffFailed) else None
            sender.release(ticket)
            return HandoffFailed(f"handoff failed ({why}); samples {ids[:8]} are only in this error's batch",
                                 batch=batch)
        try:
            batch = sender.take_back(self.src, ticket)
        except HandoffFailed as again:
            return HandoffFailed(f"handoff failed ({why}); the source refused the samples back too ({again})",
                                 batch=again.batch)
        return HandoffFailed(f"handoff failed ({why}); samples {ids[:8]} resumed on the source", batch=batch,
                             returned_to_source=True)


def migrate(src: RolloutEngine, dst: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv",
            **options) -> HandoffResult:
    """Move samples from src to dst in one call (see Handoff)."""
    return Handoff(src, dst, sample_ids, mode, **options).prepare().run()
