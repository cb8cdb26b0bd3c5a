"""The tensor-table decoder meets hostile bytes: whatever arrives, only ProtocolError escapes."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlboost.errors import ProtocolError
from rlboost.transfer.manifest import MAX_TOTAL_BYTES, Manifest

GOOD = {"format_version": 1, "alignment": 256, "total_bytes": 512,
        "tensors": [["a", "float32", [4], 0, 16], ["b", "int8", [3], 256, 3]]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20)


def _decode_or_protocol_error(data: bytes) -> None:
    try:
        m = Manifest.from_bytes(data, 1)
    except ProtocolError:
        return
    # Whatever decodes is a table the puller can trust: inside the payload and re-encodable.
    assert 0 <= m.total_bytes <= MAX_TOTAL_BYTES
    assert Manifest.from_bytes(m.to_bytes(), 1) == m


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    _decode_or_protocol_error(data)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_arbitrary_json_documents_raise_only_protocol_error(doc):
    _decode_or_protocol_error(json.dumps(doc).encode())


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["format_version", "alignment", "total_bytes", "tensors"]), json_values)
def test_one_field_replaced_by_any_json_raises_only_protocol_error(field, value):
    _decode_or_protocol_error(json.dumps({**GOOD, field: value}).encode())


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 1), st.integers(0, 4), json_values)
def test_one_tensor_field_replaced_by_any_json_raises_only_protocol_error(row, col, value):
    tensors = [list(t) for t in GOOD["tensors"]]
    tensors[row][col] = value
    _decode_or_protocol_error(json.dumps({**GOOD, "tensors": tensors}).encode())


@pytest.mark.parametrize("data", [
    b"[" * 200_000 + b"]" * 200_000,                                   # RecursionError in json
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    b'{"format_version":1,"alignment":256,"total_bytes":1e400,"tensors":[]}',   # OverflowError
    b'{"format_version":1,"alignment":256,"total_bytes":Infinity,"tensors":[]}',
    b'{"format_version":1,"alignment":256,"total_bytes":NaN,"tensors":[]}',
    b'{"format_version":1,"alignment":256,"total_bytes":512.0,"tensors":[]}',
    b'{"format_version":true,"alignment":256,"total_bytes":512,"tensors":[]}',   # bool is not int
    b'{"format_version":1,"alignment":256,"total_bytes":true,"tensors":[]}',
    b'{"format_version":1,"alignment":256,"total_bytes":' + b"9" * 5000 + b',"tensors":[]}',
    b'{"format_version":1,"alignment":256,"total_bytes":%d,"tensors":[]}' % (MAX_TOTAL_BYTES + 1),
    b'{"format_version":1,"alignment":%d,"total_bytes":0,"tensors":[]}' % (1 << 40),
    b'{"format_version":1,"alignment":256,"total_bytes":16,"tensors":[["a","uint8",[true],0,1]]}',
    b'{"format_version":1,"alignment":256,"total_bytes":16,"tensors":[["\\ud800","uint8",[1],0,1]]}',
    json.dumps({**GOOD, "tensors": [["a", "uint8", [1] * 65, 0, 1]]}).encode(),  # too many dims
    b'{"format_version":1,"alignment":256,"total_bytes":16,"tensors":{"a":1}}',
    b'{"format_version":1,"alignment":256,"total_bytes":16,"tensors":"abc"}',
    b'[1, 2, 3]',
])
def test_hostile_tables_raise_protocol_error(data):
    with pytest.raises(ProtocolError):
        Manifest.from_bytes(data, 1)


def test_well_formed_table_still_decodes():
    m = Manifest.from_bytes(json.dumps(GOOD).encode(), 7)
    assert m.version == 7 and m.names == ("a", "b") and m.total_bytes == 512
