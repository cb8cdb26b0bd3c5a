"""The RolloutEngine protocol: what the controller may ask of any engine.

Every engine (the embedded torch engine, the SGLang adapter, the emulated engine) passes
tests/rollout/engine_contract.py. Samples enter as RequestState records (fresh ones have
no output yet; resumed ones are re-prefilled from prompt + output) or as a MigrationBatch
with KV pages, and leave as token deltas or exported states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable

from rlboost.migration.state import RequestState
from rlboost.validate import check_format_version

ENGINE_RECORD_FORMAT_VERSION = 1
# The RolloutEngine protocol's calls, as a controller names them across a process boundary.
ENGINE_METHODS = ("submit", "poll", "abort", "export_states", "import_states", "load_weights", "load", "close")


def _check_version(record) -> None:
    check_format_version(record, ENGINE_RECORD_FORMAT_VERSION)


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New output tokens of one sample since the last poll.

    >>> TokenDelta(sample_id=7, start=0, ids=(5, 6), logprobs=(-0.5, -1.0), finish_reason=None,
    ...            weight_version=3).ids
    (5, 6)

    `start` is the index in the sample's output of ids[0], so a collector can detect gaps
    and duplicates; logprobs holds one value per id. finish_reason is "stop" or "length"
    on the sample's last delta.
    """

    sample_id: int
    start: int
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None
    weight_version: int
    format_version: int = ENGINE_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)
        if len(self.ids) != len(self.logprobs):
            raise ValueError(f"sample {self.sample_id}: {len(self.ids)} ids but {len(self.logprobs)} logprobs")


class PendingDeltas:
    """Token deltas an engine has produced and poll() has not yet returned, one per sample:
    tokens that come before the waiting delta is polled are appended to it, so each poll
    returns every sample's new tokens once and in order. Engines guard it with their lock.

    >>> pending = PendingDeltas()
    >>> pending.add(7, 0, (5,), (-0.5,), None, weight_version=3)
    >>> pending.add(7, 1, (6,), (-1.0,), "stop", weight_version=3)
    >>> [(d.start, d.ids, d.finish_reason) for d in pending.take()], bool(pending)
    ([(0, (5, 6), 'stop')], False)
    """

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, TokenDelta] = {}

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def add(self, sample_id: int, start: int, ids: tuple[int, ...], logprobs: tuple[float, ...],
            finish_reason: str | None, *, weight_version: int) -> None:
        prev = self._by_id.get(sample_id)
        if prev is not None:
            ids, logprobs, start = prev.ids + ids, prev.logprobs + logprobs, prev.start
        self._by_id[sample_id] = TokenDelta(sample_id=sample_id, start=start, ids=ids, logprobs=logprobs,
                                            finish_reason=finish_reason, weight_version=weight_version)

    def discard(self, sample_id: int) -> None:
        """Forget a sample's waiting tokens (it was aborted or exported)."""
        self._by_id.pop(sample_id, None)

    def take(self) -> list[TokenDelta]:
        out = list(self._by_id.values())
        self._by_id.clear()
        return out


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine reports about its load, for routing and the offload policy.

    >>> EngineLoad(running=12, queued=3, queued_tokens=4800, decode_tokens_per_s=950.0,
    ...            weight_version=5).running
    12
    """

    running: int               # samples decoding now
    queued: int                # samples admitted but not yet decoding
    queued_tokens: int         # upper bound on tokens still to generate for admitted samples
    decode_tokens_per_s: float  # measured over the recent past (0 when idle so far)
    weight_version: int        # version of the loaded weights (-1 before any load)
    format_version: int = ENGINE_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)


@runtime_checkable
class RolloutEngine(Protocol):
    """A generation engine that the controller drives sample by sample.

    Two optional class attributes declare what an engine cannot do (absent means True):
    `exports_kv` (False: export_states(with_kv=True) raises RolloutError and changes
    nothing) and `batch_invariant` (False: a sample's tokens may depend on what else is in
    the batch and on whether its earlier tokens were decoded here or re-prefilled).
    """

    def submit(self, states: Sequence[RequestState]) -> None:
        """Admit samples. Raises RolloutError if a state's weight_version is not the loaded one,
        or if a sample id is already admitted."""

    def poll(self, timeout_s: float) -> list[TokenDelta]:
        """Wait up to timeout_s for new tokens; return all deltas since the last poll.
        Raises RolloutError once the engine is closed (or has failed)."""

    def abort(self, sample_ids: Sequence[int]) -> None:
        """Drop samples; no further deltas are delivered for them, not even the undelivered
        last delta of a sample that finished since the last poll (its tokens are gone: the
        caller resumes it elsewhere from what it collected, or gives it up). Unknown ids
        are ignored."""

    def export_states(self, sample_ids: Sequence[int] | None = None, *, with_kv: bool = False):
        """Remove samples (all when None) and return a MigrationBatch of their full states
        (every generated token, polled or not), with their KV pages when with_kv.
        Unknown or already finished ids are ignored; later polls return no delta for an
        exported sample (its state carries those tokens)."""

    def import_states(self, batch) -> None:
        """Resume samples from a MigrationBatch: with KV pages when present, else re-prefill."""

    def load_weights(self, named_tensors: Mapping[str, object], version: int) -> None:
        """Replace the weights (named tensors, HF names) and tag later tokens with version.
        Raises EngineBusy (a RolloutError), changing nothing, while samples are admitted,
        and RolloutError when the names or shapes do not match the model."""

    def load(self) -> EngineLoad:
        """Report the current load."""

    def close(self) -> None:
        """Release memory and threads; the engine is unusable afterwards."""
