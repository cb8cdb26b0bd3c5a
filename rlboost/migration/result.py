"""What both ends of a handoff share: the result record, draining a source, counting what
moved, and handing a drained batch back to its source when the destination cannot take it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rlboost.errors import HandoffFailed
from rlboost.migration.state import RequestState

if TYPE_CHECKING:  # the record crosses to the controller, which never loads torch
    from rlboost.migration.batch import MigrationBatch


class HoldsSamples(Protocol):
    """What a handoff asks of an engine (the two RolloutEngine methods that move samples)."""

    def export_states(self, sample_ids: Sequence[int] | None = None, *, with_kv: bool = False) -> Any: ...
    def import_states(self, batch: Any) -> None: ...

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


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def drain(src: HoldsSamples, sample_ids: Sequence[int], mode: str) -> MigrationBatch:
    """Remove the samples from the source and return their states (and KV pages in kv mode).

    Unknown and finished ids are skipped (the engine's export contract)."""
    check_mode(mode)
    return src.export_states(list(sample_ids), with_kv=mode == "kv")


def batch_counts(batch: MigrationBatch) -> dict[str, int]:
    """samples_moved, tokens_moved, kv_bytes and reprefill_tokens of a drained batch."""
    kv_tokens = batch.kv_tokens if batch.has_kv else (0,) * len(batch.states)
    reprefill = sum(max(0, s.position - 1 - min(t, s.position - 1)) for s, t in zip(batch.states, kv_tokens))
    kv_bytes = sum(d.numel() for d in batch.kv_data) if batch.has_kv else 0
    return {"samples_moved": len(batch.states), "tokens_moved": sum(s.position for s in batch.states),
            "kv_bytes": kv_bytes, "reprefill_tokens": reprefill}


def give_back(src: HoldsSamples, batch: MigrationBatch, why: BaseException, where: str) -> HandoffFailed:
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


def make_result(mode: str, batch: MigrationBatch, batch_bytes: int, drain_s: float, pack_s: float,
                ship_s: float, unpack_s: float, resume_s: float) -> HandoffResult:
    return HandoffResult(mode=mode, states=tuple(batch.states), batch_bytes=batch_bytes, drain_s=drain_s,
                         pack_s=pack_s, ship_s=ship_s, unpack_s=unpack_s, resume_s=resume_s,
                         **batch_counts(batch))


def subset(batch: MigrationBatch, sample_ids: Collection[int]) -> MigrationBatch:
    """The part of a batch holding the given samples (in the batch's order)."""
    from rlboost.migration.batch import MigrationBatch

    keep = [i for i, s in enumerate(batch.states) if s.sample_id in sample_ids]
    if len(keep) == len(batch.states):
        return batch
    states = tuple(batch.states[i] for i in keep)
    if not batch.has_kv:
        return MigrationBatch(states=states)
    return MigrationBatch(states=states, kv_layout=batch.kv_layout,
                          kv_tokens=tuple(batch.kv_tokens[i] for i in keep),
                          kv_data=tuple(batch.kv_data[i] for i in keep))
