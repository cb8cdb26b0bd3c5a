"""RequestState: everything needed to continue one sample on another engine.

A sample is a single generation (one member of a prompt group). Its state is frozen and
versioned because it crosses processes; `pack_states`/`unpack_states` move many states as
one checksummed buffer through the native codec (csrc/migration/state_codec.h).
"""

from __future__ import annotations

import dataclasses
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Iterable

from rlboost import _C
from rlboost.errors import ProtocolError
from rlboost.validate import check_format_version

STATE_FORMAT_VERSION = 1
_U32 = 2**32
_U64 = 2**64
_I64 = 2**63


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingParams:
    """How to draw tokens for one sample.

    >>> SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=64, stop_token_ids=(2,))
    SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=64, stop_token_ids=(2,))

    temperature == 0 means greedy; top_k == 0 and top_p == 1 disable those filters.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_k < _U32:
            raise ValueError(f"top_k must be in [0, 2**32), got {self.top_k}")
        if not 1 <= self.max_new_tokens < _U32:
            raise ValueError(f"max_new_tokens must be in [1, 2**32), got {self.max_new_tokens}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestState:
    """One sample's progress: prompt, tokens generated so far and how to continue.

    >>> s = RequestState(sample_id=7, prompt_ids=(1, 2, 3), params=SamplingParams(max_new_tokens=4),
    ...                  seed=1234, weight_version=3, output_ids=(9,), output_logprobs=(-0.25,))
    >>> s.position, s.remaining_tokens
    (4, 3)

    output_logprobs hold float32 values (the codec stores them as float32, losslessly).
    Token ids must fit in u32 (checked when packed), seed in u64, weight_version in i64.
    The random draw for output token t depends only on (seed, sample_id, t), so the sample
    continues identically on any engine.
    """

    sample_id: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    weight_version: int
    output_ids: tuple[int, ...] = ()
    output_logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None  # None while running; "stop" or "length" when done
    format_version: int = STATE_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, STATE_FORMAT_VERSION)
        if not 0 <= self.sample_id < 2**64:
            raise ValueError(f"sample_id must fit in u64, got {self.sample_id}")
        if not 0 <= self.seed < _U64:
            raise ValueError(f"seed must fit in u64, got {self.seed}")
        if not -_I64 <= self.weight_version < _I64:
            raise ValueError(f"weight_version must fit in i64, got {self.weight_version}")
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"output_ids ({len(self.output_ids)}) and output_logprobs "
                f"({len(self.output_logprobs)}) differ in length")
        if self.finish_reason not in (None, "stop", "length"):
            raise ValueError(f"finish_reason must be None, 'stop' or 'length', got {self.finish_reason!r}")

    @property
    def position(self) -> int:
        """Number of tokens in the sequence so far (prompt + output)."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining_tokens(self) -> int:
        """Upper bound on tokens still to generate."""
        if self.finish_reason is not None:
            return 0
        return self.params.max_new_tokens - len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extended(self, ids: tuple[int, ...], logprobs: tuple[float, ...],
                 finish_reason: str | None = None) -> RequestState:
        """Return a copy with more output tokens appended."""
        return dataclasses.replace(
            self, output_ids=self.output_ids + tuple(ids),
            output_logprobs=self.output_logprobs + tuple(logprobs), finish_reason=finish_reason)


# One fixed-size record per state; the layout is documented in csrc/migration/state_codec.h.
_RECORD = struct.Struct("<QQqddIIIIIB3x")
_FINISH_CODES = {None: 0, "stop": 1, "length": 2}
_FINISH_NAMES = (None, "stop", "length")
_LITTLE = sys.byteorder == "little"
assert _RECORD.size == _C.migration.STATE_RECORD_BYTES
assert array("I").itemsize == 4 and array("f").itemsize == 4


def _record(s: RequestState) -> bytes:
    p = s.params
    return _RECORD.pack(
        s.sample_id, s.seed, s.weight_version, p.temperature, p.top_p, p.top_k, p.max_new_tokens,
        len(s.prompt_ids), len(s.output_ids), len(p.stop_token_ids), _FINISH_CODES[s.finish_reason])


def _column(states: list[RequestState], typecode: str, values) -> bytes:
    """Concatenate one field of every state as little-endian u32 ('I') or f32 ('f') items."""
    try:
        parts = [array(typecode, values(s)) for s in states]
    except (OverflowError, TypeError) as exc:
        for s in states:
            try:
                array(typecode, values(s))
            except (OverflowError, TypeError):
                kind = "token ids must be ints in [0, 2**32)" if typecode == "I" else "logprobs must be floats"
                raise ValueError(f"sample {s.sample_id}: {kind}") from exc
        raise
    if not _LITTLE:
        for part in parts:
            part.byteswap()
    return b"".join(parts)


def pack_states(states: Iterable[RequestState]) -> bytes:
    """Pack states into one versioned, checksummed buffer (inverse: `unpack_states`).

    Token ids travel as u32 and logprobs as float32; a state that does not fit raises
    ValueError naming its sample.
    """
    states = list(states)
    records = b"".join([_record(s) for s in states])
    return _C.migration.encode_states(
        records,
        _column(states, "I", lambda s: s.prompt_ids),
        _column(states, "I", lambda s: s.output_ids),
        _column(states, "f", lambda s: s.output_logprobs),
        _column(states, "I", lambda s: s.params.stop_token_ids),
        STATE_FORMAT_VERSION)


def _items(view: memoryview, typecode: str):
    """A sliceable sequence of the u32/f32 items in `view` (zero-copy on little-endian hosts)."""
    if _LITTLE:
        return view.cast(typecode)
    items = array(typecode, view.tobytes())
    items.byteswap()
    return items


def unpack_states(buf) -> list[RequestState]:
    """Decode a buffer made by `pack_states`.

    Raises ProtocolError if the buffer is truncated, corrupted, of another format or
    version, or describes an invalid state; nothing is allocated beyond the buffer's size.
    """
    view = memoryview(buf).cast("B")
    count, version, rec, p, o, lp, st = _C.migration.decode_states(view)
    if version != STATE_FORMAT_VERSION:
        raise ProtocolError(f"state record version {version} is not supported (expected {STATE_FORMAT_VERSION})")
    prompt, output = _items(view[p:o], "I"), _items(view[o:lp], "I")
    logprobs, stop = _items(view[lp:st], "f"), _items(view[st:len(view) - 4], "I")
    states = []
    pi = oi = si = 0
    try:
        for (sid, seed, wv, temp, top_p, top_k, max_new, n_prompt, n_out, n_stop,
             finish) in _RECORD.iter_unpack(view[rec:p]):
            params = SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, max_new_tokens=max_new,
                                    stop_token_ids=tuple(stop[si:si + n_stop]))
            states.append(RequestState(
                sample_id=sid, prompt_ids=tuple(prompt[pi:pi + n_prompt]), params=params, seed=seed,
                weight_version=wv, output_ids=tuple(output[oi:oi + n_out]),
                output_logprobs=tuple(logprobs[oi:oi + n_out]), finish_reason=_FINISH_NAMES[finish]))
            pi, oi, si = pi + n_prompt, oi + n_out, si + n_stop
    except ValueError as exc:  # the native check mirrors the records' own; this is a backstop
        raise ProtocolError(f"state buffer holds an invalid state: {exc}") from exc
    assert len(states) == count
    return states
