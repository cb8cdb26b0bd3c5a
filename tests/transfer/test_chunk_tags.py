"""The chunk check: POLYVAL matches RFC 8452 and its bit-by-bit definition on every path,
and a published version's tags are HMAC-SHA256 over POLYVAL under keys derived from the
secret as chunk_tag.h states (recomputed here with hashlib/hmac)."""

import hashlib
import hmac
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost import _C
from rlboost.transfer import WeightPublisher

from .helpers import SECRET, make_config


def test_polyval_rfc_8452_vector():
    h = bytes.fromhex("25629347589242761d31f826ba4b757b")
    x = bytes.fromhex("4f4f95668c83dfb6401762bb2d01a262" "d1a24ddd2721d006bbe45f20d3c9f362")
    want = bytes.fromhex("f7a3b47b846119fae5b7866cf5e5b77e")
    assert _C.polyval(h, x) == _C.polyval_portable(h, x) == want


@settings(max_examples=60, deadline=None)
@given(key=st.binary(min_size=16, max_size=16), data=st.binary(max_size=700), offset=st.integers(0, 31))
def test_polyval_fast_paths_match_the_definition(key, data, offset):
    buf = bytearray(offset) + data  # an unaligned start, as a received piece may have
    assert _C.polyval(key, memoryview(buf)[offset:]) == _C.polyval_portable(key, data)


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def _tag(secret: bytes, version: int, index: int, chunk: bytes) -> bytes:
    master = _hmac(secret, b"rlboost-chunk-keys-v3" + struct.pack("<q", version))
    h, tag_key = _hmac(master, b"polyval-key")[:16], _hmac(master, b"tag-key")
    msg = struct.pack("<qII", version, index, len(chunk)) + _C.polyval(h, chunk)
    return _hmac(tag_key, msg)[:16]


def test_published_tags_are_the_documented_hmac_of_polyval():
    blob = torch.randint(0, 256, (300_000,), dtype=torch.uint8)
    with WeightPublisher(make_config()) as pub:
        m = pub.publish(4, {"blob": blob})
    payload, chunk = bytes(blob.numpy()), m.chunk_bytes
    starts = range(0, m.total_bytes, chunk)
    want = b"".join(_tag(SECRET, 4, i, payload[s:s + chunk]) for i, s in enumerate(starts))
    assert m.chunk_tags == want
    assert _C.chunk_tag(SECRET, 4, 1, payload[chunk:2 * chunk]) == want[16:32]


@pytest.mark.parametrize("change", ["secret", "version", "index", "one byte"])
def test_a_tag_changes_with_the_secret_the_place_and_every_byte(change):
    chunk = bytes(range(256)) * 40
    base = _C.chunk_tag(SECRET, 1, 0, chunk)
    other = {"secret": lambda: _C.chunk_tag(b"other", 1, 0, chunk),
             "version": lambda: _C.chunk_tag(SECRET, 2, 0, chunk),
             "index": lambda: _C.chunk_tag(SECRET, 1, 1, chunk),
             "one byte": lambda: _C.chunk_tag(SECRET, 1, 0, chunk[:-1] + b"\x00")}[change]()
    assert other != base
