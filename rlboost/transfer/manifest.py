"""Manifest: the tensor table of one weight version (name, dtype, shape, offset, nbytes).

Tensors sit in one flat payload at aligned offsets, so a version moves as plain byte
chunks and is viewed as tensors without copying. Serialized as JSON (never pickle) and
validated field by field when it arrives from another process. A version may announce
that a delta from an earlier one follows (delta_base); a delta payload's table is one
uint8 tensor plus what it turns into what (DeltaSpec).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from rlboost.errors import ProtocolError

FORMAT_VERSION = 1
MAX_TENSORS = 1 << 20
MAX_TABLE_BYTES = 64 << 20  # the native manifest's metadata bound
MAX_TOTAL_BYTES = 1 << 50  # the most chunks times the largest chunk the native core accepts
MAX_ALIGNMENT = 1 << 30
MAX_DIMS = 64
MAX_VERSION = (1 << 62) - 1  # keys from 2^62 up name delta payloads (rlboost/transfer/delta.py)

# Bytes per element of every dtype a manifest may carry (torch names).
DTYPE_SIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1,
    "bool": 1, "complex64": 8, "complex128": 16,
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Where one tensor lives in the payload.

    Example: ``TensorSpec(name="lm_head.weight", dtype="bfloat16", shape=(4, 8), offset=4096, nbytes=64)``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class DeltaSpec:
    """What a delta payload turns into what: base and target versions, the target's size,
    and the hex SHA-256 of each one's chunk tags (which bind the very bytes).

    Example: ``DeltaSpec(base=3, target=4, target_bytes=4096, base_tags="ab" * 32, target_tags="cd" * 32)``.
    """

    base: int
    target: int
    target_bytes: int
    base_tags: str
    target_tags: str
    declined: bool = False  # the delta would have saved too little: its payload is a marker


@dataclass(frozen=True, slots=True)
class Manifest:
    """The layout of one weight version, plus its chunk tags once published.

    Example::

        Manifest(version=3, total_bytes=16, alignment=4096,
                 tensors=(TensorSpec(name="w", dtype="float32", shape=(2, 2), offset=0, nbytes=16),))
    """

    version: int
    tensors: tuple[TensorSpec, ...]
    total_bytes: int
    alignment: int = 4096
    chunk_bytes: int = 0  # set when published
    chunk_tags: bytes = b""  # 16 bytes per chunk (the native core's integrity tags), set when published
    delta_base: int | None = None  # the publisher also serves this version as a delta from that one
    delta: DeltaSpec | None = None  # set on a delta payload's table
    format_version: int = FORMAT_VERSION

    @classmethod
    def build(cls, version: int, named_tensors: Mapping[str, object], alignment: int = 4096) -> "Manifest":
        """Lays out tensors (anything with .dtype and .shape, e.g. torch tensors) in order."""
        layout = ((name, _dtype_name(t.dtype), tuple(t.shape)) for name, t in named_tensors.items())
        return cls.from_layout(version, layout, alignment)

    @classmethod
    def from_layout(
        cls, version: int, layout: Iterable[tuple[str, str, tuple[int, ...]]], alignment: int = 4096
    ) -> "Manifest":
        """Lays out (name, dtype, shape) triples, each at the next aligned offset."""
        if not 0 <= version <= MAX_VERSION:
            raise ValueError(f"version: must be in [0, {MAX_VERSION}], got {version}")
        specs, offset, seen = [], 0, set()
        for name, dtype, shape in layout:
            if name in seen:
                raise ValueError(f"tensor name {name!r} appears twice")
            if dtype not in DTYPE_SIZES:
                raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not one of {sorted(DTYPE_SIZES)}")
            seen.add(name)
            offset = _align(offset, alignment)
            nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
            specs.append(TensorSpec(name=name, dtype=dtype, shape=tuple(int(d) for d in shape),
                                    offset=offset, nbytes=nbytes))
            offset += nbytes
        return cls(version=version, tensors=tuple(specs), total_bytes=offset, alignment=alignment)

    def spec(self, name: str) -> TensorSpec:
        for s in self.tensors:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.tensors)

    def with_chunks(self, version: int, chunk_bytes: int, tags: bytes) -> "Manifest":
        return replace(self, version=version, chunk_bytes=chunk_bytes, chunk_tags=bytes(tags))

    def same_layout(self, other: "Manifest") -> bool:
        """Whether the two tables place the same tensors at the same offsets (a delta
        between their versions is possible)."""
        return (self.tensors, self.total_bytes, self.alignment) == (other.tensors, other.total_bytes, other.alignment)

    def to_bytes(self) -> bytes:
        """The tensor table as UTF-8 JSON (the chunk table travels in the native manifest)."""
        doc = {
            "format_version": self.format_version,
            "alignment": self.alignment,
            "total_bytes": self.total_bytes,
            "tensors": [[s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in self.tensors],
        }
        if self.delta_base is not None:
            doc["delta_base"] = self.delta_base
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, version: int, chunk_bytes: int = 0, tags: bytes = b"") -> "Manifest":
        """Parses and validates a tensor table; ProtocolError (and only that) when anything is off."""
        if len(data) > MAX_TABLE_BYTES:
            raise ProtocolError(f"manifest tensor table of {len(data)} bytes exceeds {MAX_TABLE_BYTES}")
        try:
            doc = json.loads(bytes(data).decode(), parse_constant=_reject_constant)
            fields = {k: _int_field(doc, k) for k in ("format_version", "alignment", "total_bytes")}
            if fields["format_version"] != FORMAT_VERSION:
                raise ProtocolError(f"manifest format_version {fields['format_version']} is not {FORMAT_VERSION}")
            table = doc["tensors"]
            if type(table) is not list or len(table) > MAX_TENSORS:
                raise ProtocolError(f"manifest tensors must be a list of at most {MAX_TENSORS} entries")
            delta_base = _int_field(doc, "delta_base") if "delta_base" in doc else None
            if delta_base is not None and not 0 <= delta_base < version:
                raise ProtocolError(f"manifest delta_base {delta_base} is not an earlier version than {version}")
            m = cls(version=version, tensors=tuple(_parse_spec(t) for t in table),
                    total_bytes=fields["total_bytes"], alignment=fields["alignment"],
                    chunk_bytes=chunk_bytes, chunk_tags=bytes(tags), delta_base=delta_base,
                    delta=_parse_delta(doc["delta"]) if "delta" in doc else None)
        except ProtocolError:
            raise
        # RecursionError: deeply nested JSON; OverflowError: numbers like 1e400 reaching int().
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError) as e:
            raise ProtocolError(f"malformed manifest: {type(e).__name__}: {str(e)[:200]}") from None
        m.validate()
        return m

    def validate(self) -> None:
        """Checks that every tensor is aligned, sized by its shape and inside the payload."""
        if len(self.tensors) > MAX_TENSORS:
            raise ProtocolError(f"manifest lists more than {MAX_TENSORS} tensors")
        if not 0 < self.alignment <= MAX_ALIGNMENT or self.alignment & (self.alignment - 1):
            raise ProtocolError(f"manifest alignment {self.alignment} is not a power of two up to {MAX_ALIGNMENT}")
        if not 0 <= self.total_bytes <= MAX_TOTAL_BYTES:
            raise ProtocolError(f"manifest total_bytes {self.total_bytes} is outside [0, {MAX_TOTAL_BYTES}]")
        end, names = 0, set()
        for s in sorted(self.tensors, key=lambda t: t.offset):
            size = DTYPE_SIZES.get(s.dtype)
            if size is None or s.name in names:
                raise ProtocolError(f"tensor {s.name!r}: unknown dtype or duplicate name")
            if any(d < 0 for d in s.shape) or s.nbytes != math.prod(s.shape) * size:
                raise ProtocolError(f"tensor {s.name!r}: nbytes does not match shape and dtype")
            if s.offset % self.alignment or s.offset < end or s.offset + s.nbytes > self.total_bytes:
                raise ProtocolError(f"tensor {s.name!r}: offset {s.offset} is misaligned, overlapping or out of range")
            names.add(s.name)
            end = s.offset + s.nbytes


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number a manifest may carry")


def _int_field(doc: dict, key: str) -> int:
    # type() rather than isinstance(): JSON true/false would otherwise pass as 1/0.
    value = doc[key]
    if type(value) is not int:
        raise ProtocolError(f"manifest field {key!r} must be an integer, got {type(value).__name__}")
    return value


def _parse_delta(d: dict) -> DeltaSpec:
    if type(d) is not dict:
        raise ProtocolError("manifest delta section must be an object")
    base, target, target_bytes = (_int_field(d, k) for k in ("base", "target", "target_bytes"))
    digests = [d.get(k) for k in ("base_tags", "target_tags")]
    if not all(type(x) is str and len(x) == 64 and all(c in "0123456789abcdef" for c in x) for x in digests):
        raise ProtocolError("manifest delta digests must be 64 lowercase hex characters")
    if not 0 <= base < target <= MAX_VERSION or not 0 <= target_bytes <= MAX_TOTAL_BYTES:
        raise ProtocolError(f"manifest delta {base} -> {target} of {target_bytes} bytes is out of range")
    declined = d.get("declined", False)
    if type(declined) is not bool:
        raise ProtocolError("manifest delta field 'declined' must be true or false")
    return DeltaSpec(base=base, target=target, target_bytes=target_bytes, base_tags=digests[0],
                     target_tags=digests[1], declined=declined)


def _parse_spec(t: list) -> TensorSpec:
    if type(t) is not list or len(t) != 5:
        raise ProtocolError("manifest tensor entry must be a list of 5 fields")
    name, dtype, shape, offset, nbytes = t
    if type(shape) is not list or len(shape) > MAX_DIMS:
        raise ProtocolError(f"manifest tensor shape must be a list of at most {MAX_DIMS} integers")
    if type(name) is not str or type(dtype) is not str or not all(type(v) is int for v in (offset, nbytes, *shape)):
        raise ProtocolError("manifest tensor entry has fields of the wrong type")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise ProtocolError("manifest tensor name is not valid UTF-8 (lone surrogate)") from None
    return TensorSpec(name=name, dtype=dtype, shape=tuple(shape), offset=offset, nbytes=nbytes)
