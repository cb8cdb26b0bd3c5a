"""MigrationBatch: samples moving between engines, optionally with their KV pages.

One batch crosses as one buffer (csrc/migration/batch_codec.h): the packed states, the KV
layout, and each sample's gathered KV bytes with a checksum per sample.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlboost import _C
from rlboost.errors import ProtocolError
from rlboost.migration.layout import KV_FORMAT_VERSION, KVLayout
from rlboost.migration.state import RequestState, pack_states, unpack_states
from rlboost.validate import check_format_version

if TYPE_CHECKING:
    import torch

# torch is imported where KV bytes are handled, not with the module: a batch without KV
# pages (an export of token states) goes to the controller, which never loads torch.

BATCH_FORMAT_VERSION = 1
_DTYPE_CODES = {"float32": 1, "float16": 2, "bfloat16": 3}
_DTYPE_NAMES = {code: name for name, code in _DTYPE_CODES.items()}
_BATCH_HEADER = 64
_STATE_HEADER = 48


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class MigrationBatch:
    """Samples leaving one engine for another; KV pages are optional (else re-prefill).

    >>> import torch
    >>> from rlboost.migration.state import SamplingParams
    >>> s = RequestState(sample_id=7, prompt_ids=(1, 2, 3), params=SamplingParams(), seed=1,
    ...                  weight_version=3, output_ids=(9,), output_logprobs=(-0.5,))
    >>> layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, block_size=16, dtype="float16")
    >>> b = MigrationBatch(states=(s,), kv_layout=layout, kv_tokens=(3,),
    ...                    kv_data=(torch.zeros(3 * layout.token_bytes, dtype=torch.uint8),))
    >>> unpack_batch(pack_batch(b)).kv_tokens
    (3,)

    kv_tokens[i] is how many positions of sample i have K/V (normally position - 1: the
    last sampled token has not been fed yet); kv_data[i] holds kv_tokens[i] *
    kv_layout.token_bytes bytes as made by `kv.gather_pages`. Not comparable with ==
    (it holds tensors): compare `states` and the KV fields instead.
    """

    states: tuple[RequestState, ...]
    kv_layout: KVLayout | None = None
    kv_tokens: tuple[int, ...] | None = None
    kv_data: tuple[torch.Tensor, ...] | None = None
    format_version: int = BATCH_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, BATCH_FORMAT_VERSION)
        object.__setattr__(self, "states", tuple(self.states))
        if not all(isinstance(s, RequestState) for s in self.states):
            raise ValueError("states must all be RequestState records")
        if len({s.sample_id for s in self.states}) != len(self.states):
            raise ValueError("states must have distinct sample ids")
        kv = (self.kv_layout, self.kv_tokens, self.kv_data)
        if all(v is None for v in kv):
            return
        if any(v is None for v in kv):
            raise ValueError("kv_layout, kv_tokens and kv_data must be all set or all None")
        object.__setattr__(self, "kv_tokens", tuple(_as_int(t, "kv_tokens") for t in self.kv_tokens))
        object.__setattr__(self, "kv_data", tuple(self.kv_data))
        self._check_kv()

    def _check_kv(self) -> None:
        import torch

        n = len(self.states)
        if len(self.kv_tokens) != n or len(self.kv_data) != n:
            raise ValueError(f"kv_tokens ({len(self.kv_tokens)}) and kv_data ({len(self.kv_data)}) "
                             f"need one entry per state ({n})")
        for s, tokens, data in zip(self.states, self.kv_tokens, self.kv_data):
            if not 0 <= tokens <= s.position:
                raise ValueError(f"sample {s.sample_id}: kv_tokens must be an int in [0, {s.position}], "
                                 f"got {tokens!r}")
            want = tokens * self.kv_layout.token_bytes
            if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
                raise ValueError(f"sample {s.sample_id}: kv_data must be 1-D torch.uint8 tensors")
            if data.numel() != want:
                raise ValueError(f"sample {s.sample_id}: kv_data holds {data.numel()} bytes, expected {want}")

    @property
    def has_kv(self) -> bool:
        return self.kv_layout is not None

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(s.sample_id for s in self.states)


def _as_int(value, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must hold ints, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must hold ints, got {value!r}") from None


def pack_batch(b: MigrationBatch, out=None):
    """Pack a batch into one versioned buffer (checksums: states, header, each sample's KV).

    Returns new bytes. With `out` (a writable bytearray, memoryview, numpy array or
    contiguous CPU torch.uint8 tensor of at least `packed_batch_nbytes(b)` bytes: a reused,
    pre-faulted buffer, or a publisher's staging view) it packs straight into it and
    returns the view of out's first bytes that now hold the batch (a tensor or array
    slice, else a memoryview). ValueError if `out` is too small or read-only.
    """
    if out is None:
        return _encode(b, None)
    import torch

    n = _encode(b, _writable(out))
    return out[:n] if isinstance(out, (torch.Tensor, np.ndarray)) else memoryview(out).cast("B")[:n]


def _writable(out):
    """`out` as a writable buffer the native encoder takes."""
    import torch

    if isinstance(out, torch.Tensor):
        if out.device.type != "cpu" or out.dtype != torch.uint8 or not out.is_contiguous():
            raise ValueError("out must be a contiguous CPU torch.uint8 tensor")
        return out.numpy()
    if memoryview(out).readonly:
        raise ValueError("out must be a writable buffer")
    return out


def packed_batch_nbytes(b: MigrationBatch) -> int:
    """Size of `pack_batch(b)`, without packing (mirrors csrc/migration/batch_codec.h)."""
    n = len(b.states)
    tokens = sum(len(s.prompt_ids) + 2 * len(s.output_ids) + len(s.params.stop_token_ids) for s in b.states)
    end = _BATCH_HEADER + _STATE_HEADER + n * _C.migration.STATE_RECORD_BYTES + 4 * tokens + 4
    if b.kv_layout is None:
        return end
    end = _align(end) + 16 * n
    for data in b.kv_data:
        end = _align(end) + data.numel()
    return end


def _align(v: int) -> int:
    return (v + 63) // 64 * 64


def _encode(b: MigrationBatch, out):
    from rlboost.transfer.descriptors import describe

    states = pack_states(b.states)
    if b.kv_layout is None:
        return _C.migration.encode_batch(states, len(b.states), None, b.format_version, KV_FORMAT_VERSION, [], out)
    lay = b.kv_layout
    # Keep host copies alive until the native call returns: it reads them by address.
    host = [d.detach().to("cpu").contiguous() for d in b.kv_data]
    kv = []
    for tokens, data in zip(b.kv_tokens, host):
        addr, nbytes = describe(data)
        kv.append((tokens, addr, nbytes))
    layout = (lay.num_layers, lay.num_kv_heads, lay.head_dim, lay.block_size, _DTYPE_CODES[lay.dtype])
    return _C.migration.encode_batch(states, len(b.states), layout, b.format_version, lay.format_version, kv, out)


def unpack_batch(buf) -> MigrationBatch:
    """Decode a buffer made by `pack_batch`; ProtocolError on any bad byte.

    The KV tensors are views into `buf` when it is writable (a bytearray, or a writable
    memoryview such as a receive buffer), so keep it alive and unchanged while they are
    used; from read-only bytes each sample's KV is copied once.
    """
    view = memoryview(buf).cast("B")
    count, batch_version, kv_version, s_off, s_len, layout, kv = _C.migration.decode_batch(view)
    if batch_version != BATCH_FORMAT_VERSION:
        raise ProtocolError(f"batch record version {batch_version} is not supported "
                            f"(expected {BATCH_FORMAT_VERSION})")
    states = unpack_states(view[s_off:s_off + s_len])
    if layout is None:
        return _make(states=tuple(states))
    if kv_version != KV_FORMAT_VERSION:
        raise ProtocolError(f"KV layout version {kv_version} is not supported (expected {KV_FORMAT_VERSION})")
    num_layers, num_kv_heads, head_dim, block_size, dtype = layout
    kv_layout = _make_layout(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                             block_size=block_size, dtype=_DTYPE_NAMES[dtype])
    data = tuple(_bytes_tensor(view, off, nbytes) for _, off, nbytes in kv)
    return _make(states=tuple(states), kv_layout=kv_layout, kv_tokens=tuple(t for t, _, _ in kv), kv_data=data)


def _bytes_tensor(view: memoryview, offset: int, nbytes: int) -> torch.Tensor:
    import torch

    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    part = view[offset:offset + nbytes]
    return torch.frombuffer(part if not view.readonly else bytearray(part), dtype=torch.uint8)


def _make(**fields) -> MigrationBatch:
    try:
        return MigrationBatch(**fields)
    except ValueError as exc:  # e.g. kv_tokens beyond a state's position, duplicate ids
        raise ProtocolError(f"batch buffer holds an invalid batch: {exc}") from exc


def _make_layout(**fields) -> KVLayout:
    try:
        return KVLayout(**fields)
    except ValueError as exc:
        raise ProtocolError(f"batch buffer holds an invalid KV layout: {exc}") from exc
