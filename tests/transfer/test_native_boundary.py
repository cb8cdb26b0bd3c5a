"""The native module's boundary checks what it is handed: a direct call with a value out
of range (no Python config in between) is a ValueError naming the argument, never a crash."""

from __future__ import annotations

import pytest

from rlboost import _C

SECRET = b"boundary-secret"


def _server(**kwargs):
    store = _C.VersionStore(versions_kept=1, secret=SECRET)
    return _C.WeightServer(**{"store": store, "host": "127.0.0.1", "port": 0, "secret": SECRET, **kwargs})


@pytest.mark.parametrize("kwargs, name", [
    ({"max_handshakes": 0}, "max_handshakes"),
    ({"max_handshakes": -5}, "max_handshakes"),
    ({"max_connections": 0}, "max_connections"),
    ({"max_connections_per_peer": 0}, "max_connections_per_peer"),
    ({"encrypt": 3}, "encrypt"),
    ({"encrypt": -1}, "encrypt"),
    ({"handshake_timeout_s": 0.0}, "handshake_timeout_s"),
    ({"send_timeout_s": float("nan")}, "send_timeout_s"),
    ({"port": 70000}, "port"),
])
def test_a_server_argument_out_of_range_is_a_value_error(kwargs, name):
    with pytest.raises(ValueError, match=name):
        _server(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    ({"streams": 0}, "streams"),
    ({"max_in_flight": 0}, "max_in_flight"),
    ({"encrypt": 9}, "encrypt"),
    ({"request_timeout_s": -1.0}, "request_timeout_s"),
    ({"max_version_bytes": 0}, "max_version_bytes"),
    ({"relay_poll_ms": 0}, "relay_poll_ms"),
])
def test_a_puller_argument_out_of_range_is_a_value_error(kwargs, name):
    args = {"sources": [("127.0.0.1", 1)], "secret": SECRET, "transport": "tcp", "streams": 1, "max_in_flight": 1,
            "request_timeout_s": 1.0, "connect_timeout_s": 1.0, "reconnect_attempts": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        _C.Puller(**args)


def test_a_store_keeping_no_versions_is_a_value_error():
    with pytest.raises(ValueError, match="versions_kept"):
        _C.VersionStore(versions_kept=0, secret=SECRET)
