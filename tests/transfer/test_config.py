"""TransferConfig rejects bad values naming the field; secrets are per run, never implicit
from the environment, never empty by accident and never written out."""

import dataclasses

import pytest

from rlboost.config.overrides import to_dict
from rlboost.errors import AuthError
from rlboost.transfer import ServerConfig, TransferConfig, WeightPublisher, WeightPuller, new_secret, run_secret


@pytest.mark.parametrize("field, value", [
    ("transport", "carrier-pigeon"), ("streams", 0), ("streams", 65), ("chunk_bytes", 100),
    ("chunk_bytes", 1 << 30), ("max_in_flight", 0), ("request_timeout_s", 0), ("alignment", 100),
    ("reconnect_attempts", -1), ("secret", "not-bytes"), ("secret", b""), ("keep_connections", "yes"),
    ("connection_idle_s", 0), ("relay_poll_s", 0), ("relay_poll_s", 61), ("frame_timeout_s", 0),
    ("lease_timeout_s", 0), ("handshake_timeout_s", 0), ("handshake_timeout_s", 61),
    ("request_timeout_s", 3601), ("send_timeout_s", 0), ("resolve_timeout_s", 0), ("connect_timeout_s", 1e12),
    ("connect_timeout_s", float("nan")), ("allow_no_secret", "yes"), ("publisher", {"port": 1}),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TransferConfig(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("egress_bytes_per_s", 10), ("versions_kept", 0), ("port", 70000), ("max_connections", 0),
    ("max_connections_per_peer", 0), ("max_connections_per_host", 0), ("max_handshakes", 0),
])
def test_invalid_server_limits_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ServerConfig(**{field: value})


def test_non_loopback_bind_requires_a_shared_secret(monkeypatch):
    monkeypatch.delenv("RLBOOST_SECRET", raising=False)
    wide = TransferConfig(bind_host="0.0.0.0")  # a run hands it its secret before any server starts
    with pytest.raises(ValueError, match="secret"):
        wide.require_secret()  # this process's own secret would do no good across machines
    with pytest.raises(ValueError, match="secret"):
        WeightPublisher(wide)
    assert TransferConfig(bind_host="0.0.0.0", secret=b"x").require_secret() == b"x"


def test_an_empty_secret_is_for_loopback_tests_only():
    assert TransferConfig(secret=b"", allow_no_secret=True).require_secret() == b""
    with pytest.raises(ValueError, match="allow_no_secret"):
        TransferConfig(secret=b"", allow_no_secret=True, bind_host="0.0.0.0")


def test_the_environment_secret_is_taken_when_none_is_given(monkeypatch):
    monkeypatch.setenv("RLBOOST_SECRET", "from-env")
    assert TransferConfig().secret == b"from-env" and run_secret() == b"from-env"
    assert TransferConfig(secret=b"mine").secret == b"mine"
    monkeypatch.delenv("RLBOOST_SECRET")
    assert TransferConfig().secret is None
    fresh = run_secret()
    assert len(fresh) == 64 and fresh != run_secret() and fresh != new_secret()


def test_the_secret_never_reaches_repr_or_config_files():
    secret = new_secret()
    config = TransferConfig(secret=secret)
    assert secret.decode() not in repr(config)
    assert to_dict(config)["secret"] is None


def test_without_a_secret_only_this_process_connects(monkeypatch):
    monkeypatch.delenv("RLBOOST_SECRET", raising=False)
    # A config without a secret serves under this process's own random secret: pullers
    # here connect; one holding any other secret (say, the empty one) cannot.
    with WeightPublisher(TransferConfig(transport="tcp")) as pub:
        import torch

        pub.publish(1, {"w": torch.ones(3)})
        with WeightPuller(pub.address, TransferConfig(transport="tcp", relay=False)) as here:
            assert here.pull(1)["w"].sum() == 3
        stranger = TransferConfig(secret=b"", allow_no_secret=True, relay=False)
        with WeightPuller(pub.address, stranger) as other, pytest.raises(AuthError):
            other.pull(1)


def test_egress_cap_belongs_to_one_role():
    capped = TransferConfig(publisher=ServerConfig(egress_bytes_per_s=1 << 20))
    assert capped.relay_server.egress_bytes_per_s is None and capped.handoff.egress_bytes_per_s is None
    again = dataclasses.replace(capped, streams=8)
    assert again.publisher.egress_bytes_per_s == 1 << 20


def test_environment_transport_is_validated(monkeypatch):
    monkeypatch.setenv("RLBOOST_TRANSPORT", "bogus")
    with pytest.raises(ValueError, match="transport"):
        TransferConfig()
