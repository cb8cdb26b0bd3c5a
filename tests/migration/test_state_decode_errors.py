"""A truncated, corrupted, foreign or hostile state buffer raises ProtocolError, nothing else."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest

from rlboost.errors import ProtocolError
from rlboost.migration.state import pack_states, unpack_states

from .hostile import STATE_HEADER, STATE_RECORD, put, reseal_states
from .strategies import long_state


@pytest.fixture(scope="module")
def valid() -> bytes:
    return pack_states([long_state(1, 3, 5, seed=1), long_state(2, 4, 0, seed=2), long_state(3, 2, 7, seed=3)])


def test_every_truncation_is_rejected(valid):
    for cut in range(len(valid)):
        with pytest.raises(ProtocolError):
            unpack_states(valid[:cut])


def test_trailing_bytes_are_rejected(valid):
    with pytest.raises(ProtocolError, match="length"):
        unpack_states(valid + b"\0")


def test_every_single_byte_corruption_is_rejected(valid):
    rng = random.Random(0)
    for pos in range(len(valid)):  # small buffer: every position, a few values each
        for delta in rng.sample(range(1, 256), 3):
            bad = bytearray(valid)
            bad[pos] ^= delta
            with pytest.raises(ProtocolError):
                unpack_states(bytes(bad))


def test_corruption_of_a_large_buffer_is_rejected():
    buf = pack_states([long_state(i, 100, 3000, seed=i) for i in range(8)])
    rng = random.Random(1)
    for pos in rng.sample(range(len(buf)), 300):
        bad = bytearray(buf)
        bad[pos] ^= rng.randrange(1, 256)
        with pytest.raises(ProtocolError):
            unpack_states(bytes(bad))


def test_wrong_magic_and_versions(valid):
    with pytest.raises(ProtocolError, match="magic"):
        unpack_states(b"XXXX" + valid[4:])
    with pytest.raises(ProtocolError, match="wire version 2"):
        unpack_states(reseal_states(put(valid, 4, "<H", 2)))
    with pytest.raises(ProtocolError, match="record version 9"):
        unpack_states(reseal_states(put(valid, 6, "<H", 9)))
    with pytest.raises(ProtocolError, match="flags"):
        unpack_states(reseal_states(put(valid, 12, "<I", 1)))


@pytest.mark.parametrize("offset, fmt, value", [
    (8, "<I", 2**32 - 1),     # count
    (8, "<I", 2**24),         # count just past the limit
    (8, "<I", 4),             # count one more than present
    (16, "<Q", 2**64 - 1),    # total length
    (24, "<Q", 2**63),        # prompt token total
    (32, "<Q", 2**36),        # output token total
    (40, "<Q", 2**64 - 1),    # stop token total
    (24, "<Q", 1),            # totals that fit but disagree with the records
])
def test_hostile_header_fields(valid, offset, fmt, value):
    with pytest.raises(ProtocolError):
        unpack_states(reseal_states(put(valid, offset, fmt, value)))


def _record_field(index: int, field_offset: int) -> int:
    return STATE_HEADER + index * STATE_RECORD + field_offset


@pytest.mark.parametrize("field_offset, fmt, value, message", [
    (24, "<d", -1.0, "temperature"),
    (24, "<d", float("nan"), "temperature"),
    (32, "<d", 0.0, "top_p"),
    (32, "<d", 5.0, "top_p"),
    (44, "<I", 0, "max_new_tokens"),
    (48, "<I", 0, "prompt"),
    (48, "<I", 2**32 - 1, "add up"),
    (52, "<I", 2**31, "add up"),
    (60, "<B", 3, "finish"),
    (61, "<B", 1, "reserved"),
])
def test_hostile_records_with_valid_checksum(valid, field_offset, fmt, value, message):
    bad = reseal_states(put(valid, _record_field(1, field_offset), fmt, value))
    with pytest.raises(ProtocolError, match=message):
        unpack_states(bad)


def test_hostile_buffers_never_allocate_beyond_their_size(tmp_path):
    """Under an address-space limit of ~256 MiB above the baseline, forged counts of 2**36
    tokens must be refused by checks, not by a failed (or successful) huge allocation."""
    script = textwrap.dedent("""
        import resource, struct
        from rlboost.errors import ProtocolError
        from rlboost.migration.state import pack_states, unpack_states
        from rlboost import _C
        from rlboost.migration.state import RequestState, SamplingParams
        s = RequestState(sample_id=1, prompt_ids=(1, 2), params=SamplingParams(), seed=0, weight_version=0)
        valid = pack_states([s])
        def forged(offset, fmt, value):
            b = bytearray(valid); struct.pack_into(fmt, b, offset, value)
            struct.pack_into("<I", b, len(b) - 4, _C.migration.crc32c(bytes(b[:-4])))
            return bytes(b)
        vm = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize"))) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
        cases = [(8, "<I", 2**24), (24, "<Q", 2**36), (32, "<Q", 2**36), (40, "<Q", 2**36),
                 (16, "<Q", 2**62), (48 + 48, "<I", 2**32 - 1), (48 + 52, "<I", 2**32 - 1)]
        for offset, fmt, value in cases:
            try:
                unpack_states(forged(offset, fmt, value))
            except ProtocolError:
                continue
            raise SystemExit(f"decoded a forged buffer at {offset}")
        print("refused", len(cases))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused 7"
