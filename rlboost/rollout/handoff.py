"""Handoff of in-flight samples between two rollout engines: drain them from the source
(export their states, with KV pages or not), ship the packed batch as bytes (in-process,
or as a one-tensor payload over rlboost.transfer between processes), and resume them on
the destination. A refused or failed handoff never loses a sample.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from rlboost.errors import HandoffFailed, ProtocolError, RolloutError, TransferTimeout
from rlboost.migration.batch import MigrationBatch, pack_batch, unpack_batch
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import RolloutEngine
from rlboost.transfer import Manifest, TransferConfig, WeightPublisher, WeightPuller
from rlboost.transfer.config import parse_address

__all__ = ["HANDOFF_FORMAT_VERSION", "MODES", "Channel", "Handoff", "HandoffResult", "HandoffTicket",
           "InProcessChannel", "SampleReceiver", "SampleSender", "TransferChannel", "migrate"]

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


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _check_kv_compatible(src: RolloutEngine, dst: RolloutEngine) -> None:
    """Refuse a KV handoff up front, before anything is drained, when the pages cannot fit."""
    ours, theirs = getattr(src, "kv_layout", None), getattr(dst, "kv_layout", None)
    if ours is None or theirs is None:
        return  # an engine that does not say: its import_states is the judge
    if not ours.compatible_with(theirs):
        raise RolloutError(f"KV pages cannot move: source layout {ours}, destination {theirs}; "
                           "use mode='tokens'")


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


# ---- shipping over rlboost.transfer ---------------------------------------------------

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

    def ship(self, payload: bytes, timeout: float | None = None) -> np.ndarray:
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


@dataclass(frozen=True, kw_only=True, slots=True)
class HandoffTicket:
    """Where a drained batch waits for its destination; the source hands it to whoever
    tells the destination (a controller), so it crosses processes.

    >>> HandoffTicket(address="127.0.0.1:41000", key=3, nbytes=8192, mode="kv", sample_ids=(7, 9),
    ...               drain_s=0.002, pack_s=0.001, publish_s=0.001).key
    3
    """

    address: str
    key: int
    nbytes: int
    mode: str
    sample_ids: tuple[int, ...]
    drain_s: float
    pack_s: float
    publish_s: float
    format_version: int = HANDOFF_FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.format_version != HANDOFF_FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version} is not {HANDOFF_FORMAT_VERSION}")
        _check_mode(self.mode)
        parse_address(self.address)
        if self.key < 0 or self.nbytes < 1:
            raise ValueError(f"key must be >= 0 and nbytes >= 1, got key={self.key}, nbytes={self.nbytes}")


class SampleSender:
    """Source side of a handoff between processes: drains samples and publishes the packed
    batch on its own publisher until the destination has them.

        sender = SampleSender()
        ticket = sender.send(engine, [3, 7], mode="kv")   # give the ticket to the destination
        sender.release(ticket)                 # destination resumed them, or:
        sender.take_back(engine, ticket)       # destination refused: resume them here

    Keeps each drained batch until release() or take_back(), so a refusal loses nothing.
    """

    def __init__(self, config: TransferConfig | None = None):
        self.publisher = WeightPublisher(config if config is not None else TransferConfig(versions_kept=16))
        self._keys = itertools.count()
        self._pending: dict[int, MigrationBatch] = {}
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self.publisher.address

    def send(self, src: RolloutEngine, sample_ids: Sequence[int], mode: str = "kv") -> HandoffTicket:
        t0 = time.perf_counter()
        batch = drain(src, sample_ids, mode)
        t1 = time.perf_counter()
        with self._lock:
            key = next(self._keys)
        try:
            payload = pack_batch(batch)
            t2 = time.perf_counter()
            _publish(self.publisher, key, payload)
            t3 = time.perf_counter()
        except Exception as exc:
            raise give_back(src, batch, exc, "publishing the batch") from exc
        with self._lock:
            self._pending[key] = batch
        return HandoffTicket(address=self.address, key=key, nbytes=len(payload), mode=mode,
                             sample_ids=batch.sample_ids, drain_s=t1 - t0, pack_s=t2 - t1, publish_s=t3 - t2)

    def release(self, ticket: HandoffTicket) -> None:
        """The destination has the samples: stop serving them and drop the kept batch."""
        with self._lock:
            self._pending.pop(ticket.key, None)
        self.publisher.retire(ticket.key)

    def take_back(self, src: RolloutEngine, ticket: HandoffTicket) -> MigrationBatch:
        """Resume on `src` the samples of a ticket whose destination refused them; returns
        their batch (its states carry every token generated before the move).
        Raises HandoffFailed (holding the batch) if the source refuses them too."""
        with self._lock:
            batch = self._pending.pop(ticket.key)
        try:
            src.import_states(batch)
        except Exception as exc:
            raise HandoffFailed(f"the source refused samples {list(batch.sample_ids)[:8]} back ({exc})",
                                batch=batch) from exc
        finally:
            self.publisher.retire(ticket.key)
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

    def receive(self, dst: RolloutEngine, ticket: HandoffTicket, timeout: float | None = None) -> HandoffResult:
        """Pull, unpack and import. Transfer errors propagate (the sender still holds the
        batch); a refusing destination raises HandoffFailed with the batch, and the
        sender's take_back() resumes it on the source."""
        t0 = time.perf_counter()
        buffer = _pull(self.puller, ticket.address, ticket.key, ticket.nbytes, timeout)
        t1 = time.perf_counter()
        batch = unpack_batch(buffer)
        t2 = time.perf_counter()
        try:
            if batch.states:
                dst.import_states(batch)
        except Exception as exc:
            raise HandoffFailed(f"destination refused samples {list(batch.sample_ids)[:8]} ({exc}); "
                                "the sender still holds them (take_back)", batch=batch) from exc
        t3 = time.perf_counter()
        return _result(ticket.mode, batch, ticket.nbytes, ticket.drain_s, ticket.pack_s,
                       ticket.publish_s + t1 - t0, t2 - t1, t3 - t2)

    def close(self) -> None:
        self.puller.close()

    def __enter__(self) -> SampleReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
