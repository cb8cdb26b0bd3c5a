"""SampleSender: the source end of a handoff between processes. It drains samples from its
engine and serves the packed batch from its own version server (the transfer layer's
store of numbered byte payloads, which also serves weights); a small ticket crosses
through whoever coordinates (the controller), and the destination's SampleReceiver pulls
the bytes straight from here. Bulk bytes never pass the coordinator.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Collection, Sequence

from rlboost.errors import HandoffFailed, RolloutError
from rlboost.migration.batch import MigrationBatch, pack_batch
from rlboost.migration.result import HoldsSamples, drain, give_back, subset
from rlboost.migration.state import RequestState
from rlboost.migration.ticket import HandoffTicket
from rlboost.transfer import TransferConfig
from rlboost.transfer.versions import VersionServer


class SampleSender:
    """Source side of a handoff between processes: drains samples and serves the packed
    batch until the destination has them.

        sender = SampleSender()
        ticket = sender.send(engine, [3, 7], mode="kv")   # give the ticket to the destination
        sender.release(ticket)                 # destination resumed them, or:
        sender.take_back(engine, ticket)       # destination refused: resume them here

    Keeps each drained batch until all of its samples are released or taken back (both
    take an optional subset, for a batch whose samples go to several destinations), so a
    refusal loses nothing. It holds at most `config.handoff.versions_kept` batches: send()
    refuses (RolloutError, before draining anything) rather than let the server evict one.
    """

    def __init__(self, config: TransferConfig | None = None):
        config = config if config is not None else TransferConfig()
        self.server = VersionServer(config, config.handoff)
        self._keys = itertools.count()
        self._pending: dict[int, tuple[MigrationBatch, set[int]]] = {}  # key -> (batch, ids still out)
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def pending(self) -> int:
        """Batches served and not yet fully released or taken back."""
        with self._lock:
            return len(self._pending)

    def send(self, src: HoldsSamples, sample_ids: Sequence[int], mode: str = "kv") -> HandoffTicket:
        capacity = self.server.role.versions_kept
        with self._lock:
            if len(self._pending) >= capacity:
                raise RolloutError(f"the sender already serves {capacity} batches (versions_kept); release "
                                   "or take back some before sending more")
            key = next(self._keys)
        t0 = time.perf_counter()
        batch = drain(src, sample_ids, mode)
        t1 = time.perf_counter()
        try:
            payload = pack_batch(batch)
            t2 = time.perf_counter()
            self.server.serve_bytes(key, payload)
            t3 = time.perf_counter()
        except Exception as exc:
            raise give_back(src, batch, exc, "publishing the batch") from exc
        with self._lock:
            self._pending[key] = (batch, set(batch.sample_ids))
        return HandoffTicket(address=self.address, key=key, nbytes=len(payload), mode=mode,
                             sample_ids=batch.sample_ids, drain_s=t1 - t0, pack_s=t2 - t1, publish_s=t3 - t2)

    def states(self, ticket: HandoffTicket) -> tuple[RequestState, ...]:
        """The drained states of a pending ticket (tokens only: no KV pages)."""
        with self._lock:
            return self._pending[ticket.key][0].states

    def _settle(self, ticket: HandoffTicket, sample_ids: Collection[int] | None) -> MigrationBatch | None:
        """Mark samples of a ticket as accounted for; returns their part of the batch
        (None when the ticket is no longer held)."""
        with self._lock:
            held = self._pending.get(ticket.key)
            if held is None:
                return None
            batch, out = held
            ids = out if sample_ids is None else out & set(sample_ids)
            part = subset(batch, ids)
            out -= ids
            done = not out
            if done:
                del self._pending[ticket.key]
        if done:
            self.server.retire(ticket.key)
        return part

    def release(self, ticket: HandoffTicket, sample_ids: Collection[int] | None = None) -> None:
        """The destination has these samples (default: all of the ticket), or they are given
        up: drop them; the batch stops being served once none is left."""
        self._settle(ticket, sample_ids)

    def take_back(self, src: HoldsSamples, ticket: HandoffTicket,
                  sample_ids: Collection[int] | None = None) -> MigrationBatch:
        """Resume on `src` the samples of a ticket (default: all still held) whose destination
        refused them; returns their batch (its states carry every token generated before
        the move). Raises HandoffFailed (holding the batch) if the source refuses them too."""
        batch = self._settle(ticket, sample_ids)
        if batch is None:
            raise RolloutError(f"ticket {ticket.key} is not held by this sender (released or taken back)")
        try:
            if batch.states:
                src.import_states(batch)
        except Exception as exc:
            raise HandoffFailed(f"the source refused samples {list(batch.sample_ids)[:8]} back ({exc})",
                                batch=batch) from exc
        return batch

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> SampleSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
