"""The native module builds, reports its options and raises typed errors."""

import subprocess
import sys

import pytest

from rlboost import errors


def test_import_native_does_not_import_torch():
    code = "import sys, rlboost._C; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_build_flags_are_booleans():
    from rlboost import _C

    assert isinstance(_C.HAS_UCX, bool)
    assert isinstance(_C.HAS_CUDA, bool)
    assert isinstance(_C.HAS_AEAD, bool)


def test_rlboost_info_says_whether_frames_can_be_sealed():
    from rlboost import _C

    out = subprocess.run([sys.executable, "-m", "rlboost.cli", "info"], check=True, capture_output=True, text=True)
    assert f"HAS_AEAD={_C.HAS_AEAD}" in out.stdout


@pytest.mark.parametrize(
    "name, cls",
    [
        ("protocol", errors.ProtocolError),
        ("auth", errors.AuthError),
        ("timeout", errors.TransferTimeout),
        ("peer_lost", errors.PeerLost),
        ("checksum", errors.ChecksumMismatch),
        ("unknown_version", errors.VersionMismatch),
    ],
)
def test_native_status_becomes_typed_exception(name, cls):
    from rlboost import _C, _C_testing

    with pytest.raises(cls, match="boom"):
        _C_testing.raise_status(_C.STATUS_CODES[name], "boom")
