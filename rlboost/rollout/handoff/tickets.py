"""Handoff between processes: the source drains samples and serves the packed batch on its
own publisher; a small ticket crosses through whoever coordinates (a controller), and the
destination pulls the bytes straight from the source. Bulk bytes never pass the coordinator.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Collection, Sequence

import numpy as np
import torch

from rlboost.errors import HandoffFailed, ProtocolError, RolloutError
from rlboost.migration.batch import MigrationBatch, pack_batch, unpack_batch
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import RolloutEngine
from rlboost.rollout.handoff.result import HandoffResult, drain, give_back, make_result, subset
from rlboost.rollout.handoff.ticket import HandoffTicket
from rlboost.transfer import Manifest, TransferConfig, WeightPublisher, WeightPuller

DEFAULT_TIMEOUT_S = 60.0

PAYLOAD_NAME = "migration_batch"


def _publish(publisher: WeightPublisher, key: int, payload: bytes) -> None:
    """Serve the packed batch as version `key`: one uint8 tensor, staged with one copy."""
    manifest = Manifest.from_layout(key, [(PAYLOAD_NAME, "uint8", (len(payload),))],
                                    publisher.config.alignment)
    view = publisher.stage(key, manifest)[PAYLOAD_NAME]
    try:
        view.numpy()[:] = np.frombuffer(payload, dtype=np.uint8)
    except BaseException:
        publisher.discard(key)
        raise
    publisher.commit(key)


def _pull(puller: WeightPuller, address: str, key: int, nbytes: int, timeout: float | None) -> np.ndarray:
    """Pull version `key` into a fresh numpy buffer (huge-page backed, so first touch is cheap);
    unpack_batch then views the KV pages in it, and they keep it alive."""
    buffer = np.empty(nbytes, dtype=np.uint8)
    pulled = puller.pull(version=key, into=torch.from_numpy(buffer), timeout=timeout, sources=address)
    if pulled.manifest.total_bytes != nbytes:
        raise ProtocolError(f"payload {key} holds {pulled.manifest.total_bytes} bytes, the ticket says {nbytes}")
    puller.retire(key)  # a relaying puller would otherwise keep serving it
    return buffer


class TransferChannel:
    """Ships through the transfer layer (shared memory or TCP) although both engines are
    in this process: the same path as between processes, for measuring it or for engines
    that only share a host. Closes its publisher and puller on close()."""

    def __init__(self, config: TransferConfig | None = None):
        config = config if config is not None else TransferConfig(relay=False)
        self.publisher = WeightPublisher(config)
        self.puller = WeightPuller((), config)
        self._keys = itertools.count()

    def ship(self, payload: bytes, timeout: float | None = DEFAULT_TIMEOUT_S) -> np.ndarray:
        key = next(self._keys)
        _publish(self.publisher, key, payload)
        try:
            return _pull(self.puller, self.publisher.address, key, len(payload), timeout)
        finally:
            self.publisher.retire(key)

    def close(self) -> None:
        self.puller.close()
        self.publisher.close()

    def __enter__(self) -> TransferChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SampleSender:
    """Source side of a handoff between processes: drains samples and publishes the packed
    batch on its own publisher until the destination has them.

        sender = SampleSender()
        ticket = sender.send(engine, [3, 7], mode="kv")   # give the ticket to the destination
        sender.release(ticket)                 # destination resumed them, or:
        sender.take_back(engine, ticket)       # destination refused: resume them here

    Keeps each drained batch until all of its samples are released or taken back (both
    take an optional subset, for a batch whose samples go to several destinations), so a
    refusal loses nothing. It holds at most `config.handoff.versions_kept` batches: send() refuses
    (RolloutError, before draining anything) rather than let the publisher evict one.
    """

    def __init__(self, config: TransferConfig | None = None):
        config = config if config is not None else TransferConfig()
        self.publisher = WeightPublisher(config, server=config.handoff)
        self._keys = itertools.count()
        self._pending: dict[int, tuple[MigrationBatch, set[int]]] = {}  # key -> (batch, ids still out)
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self.publisher.address

    @property
    def pending(self) -> int:
        """Batches served and not yet fully released or taken back."""
        with self._lock:
            return len(self._pending)

    def send(self, src: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv") -> HandoffTicket:
        capacity = self.publisher.server_config.versions_kept
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
            _publish(self.publisher, key, payload)
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
            self.publisher.retire(ticket.key)
        return part

    def release(self, ticket: HandoffTicket, sample_ids: Collection[int] | None = None) -> None:
        """The destination has these samples (default: all of the ticket), or they are given
        up: drop them; the batch stops being served once none is left."""
        self._settle(ticket, sample_ids)

    def take_back(self, src: RolloutEngine, ticket: HandoffTicket,
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
        self.publisher.close()

    def __enter__(self) -> SampleSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SampleReceiver:
    """Destination side: pulls a ticket's batch from the source's sender and resumes it."""

    def __init__(self, config: TransferConfig | None = None):
        self.puller = WeightPuller((), config if config is not None else TransferConfig(relay=False))

    def receive(self, dst: RolloutEngine, ticket: HandoffTicket, timeout: float | None = DEFAULT_TIMEOUT_S,
                sample_ids: Collection[int] | None = None) -> HandoffResult:
        """Pull, unpack and import (only `sample_ids` of the ticket, when given). Transfer
        errors propagate, TransferTimeout after `timeout` s (the sender still holds the
        batch); a refusing destination raises HandoffFailed with the batch, and the
        sender's take_back() resumes it on the source."""
        t0 = time.perf_counter()
        buffer = _pull(self.puller, ticket.address, ticket.key, ticket.nbytes, timeout)
        t1 = time.perf_counter()
        batch = unpack_batch(buffer)
        if sample_ids is not None:
            batch = subset(batch, set(sample_ids))
        t2 = time.perf_counter()
        try:
            if batch.states:
                dst.import_states(batch)
        except Exception as exc:
            raise HandoffFailed(f"destination refused samples {list(batch.sample_ids)[:8]} ({exc}); "
                                "the sender still holds them (take_back)", batch=batch) from exc
        t3 = time.perf_counter()
        return make_result(ticket.mode, batch, ticket.nbytes, ticket.drain_s, ticket.pack_s,
                           ticket.publish_s + t1 - t0, t2 - t1, t3 - t2)

    def close(self) -> None:
        self.puller.close()

    def __enter__(self) -> SampleReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
