"""TransferConfig rejects bad values naming the field, and reads the environment once."""

import pytest

from rlboost.transfer import TransferConfig


@pytest.mark.parametrize("field, value", [
    ("transport", "carrier-pigeon"), ("streams", 0), ("streams", 65), ("chunk_bytes", 100),
    ("chunk_bytes", 1 << 30), ("max_in_flight", 0), ("request_timeout_s", 0),
    ("egress_bytes_per_s", 10), ("versions_kept", 0), ("alignment", 100), ("port", 70000),
    ("reconnect_attempts", -1), ("secret", "not-bytes"), ("keep_connections", "yes"),
    ("connection_idle_s", 0), ("relay_poll_s", 0), ("relay_poll_s", 61),
    ("max_handshakes", 0), ("handshake_timeout_s", 0), ("handshake_timeout_s", 61),
    ("request_timeout_s", 3601), ("send_timeout_s", 0), ("resolve_timeout_s", 0), ("connect_timeout_s", 1e12), ("connect_timeout_s", float("nan")),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TransferConfig(**{field: value})


def test_non_loopback_bind_requires_a_secret(monkeypatch):
    monkeypatch.delenv("RLBOOST_SECRET", raising=False)
    with pytest.raises(ValueError, match="secret"):
        TransferConfig(bind_host="0.0.0.0")
    assert TransferConfig(bind_host="0.0.0.0", secret=b"x").secret == b"x"


def test_environment_supplies_secret_and_transport(monkeypatch):
    monkeypatch.setenv("RLBOOST_SECRET", "from-env")
    monkeypatch.setenv("RLBOOST_TRANSPORT", "tcp")
    c = TransferConfig()
    assert c.secret == b"from-env" and c.transport == "tcp"
    explicit = TransferConfig(secret=b"mine", transport="shm")
    assert explicit.secret == b"mine" and explicit.transport == "shm"


def test_environment_transport_is_validated(monkeypatch):
    monkeypatch.setenv("RLBOOST_TRANSPORT", "bogus")
    with pytest.raises(ValueError, match="transport"):
        TransferConfig()
