"""Helpers that forge buffers: field offsets of the wire formats and checksum fix-ups."""

from __future__ import annotations

import struct

from rlboost import _C

STATE_HEADER = 48
STATE_RECORD = 64
BATCH_HEADER = 64
BATCH_META_CRC = 60


def put(buf: bytes, offset: int, fmt: str, value) -> bytearray:
    out = bytearray(buf)
    struct.pack_into(fmt, out, offset, value)
    return out


def reseal_states(buf) -> bytes:
    """Recompute a state buffer's trailing checksum so only its semantic checks remain."""
    out = bytearray(buf)
    struct.pack_into("<I", out, len(out) - 4, _C.migration.crc32c(bytes(out[:-4])))
    return bytes(out)


def reseal_batch_header(buf, table_offset: int = 0, count: int = 0) -> bytes:
    """Recompute a batch's header checksum (over the first 60 bytes and the KV table)."""
    out = bytearray(buf)
    meta = bytes(out[:BATCH_META_CRC]) + bytes(out[table_offset:table_offset + 16 * count])
    struct.pack_into("<I", out, BATCH_META_CRC, _C.migration.crc32c(meta))
    return bytes(out)
