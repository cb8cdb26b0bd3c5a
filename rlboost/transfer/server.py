"""start_server: a native weight server with one role's limits (transfer.config.ServerConfig)
and the run's shared timeouts; the publisher and every puller's relay start theirs here."""

from __future__ import annotations

from rlboost import _C
from rlboost.transfer.config import ENCRYPT_CODES, ServerConfig, TransferConfig, warn_if_clear_text


def start_server(store, config: TransferConfig, server: ServerConfig, secret: bytes):
    """A native weight server for `store` with one role's limits and the shared timeouts."""
    warn_if_clear_text(config, [config.bind_host])
    return _C.WeightServer(
        store=store, host=config.bind_host, port=server.port, secret=secret,
        egress_bytes_per_s=server.egress_bytes_per_s or 0, max_connections=server.max_connections,
        max_connections_per_peer=server.max_connections_per_peer,
        max_connections_per_host=server.max_connections_per_host, max_handshakes=server.max_handshakes,
        handshake_timeout_s=config.handshake_timeout_s, frame_timeout_s=config.frame_timeout_s,
        send_timeout_s=config.send_timeout_s, lease_timeout_s=config.lease_timeout_s,
        encrypt=ENCRYPT_CODES[config.encrypt],
    )
