"""VersionServer: numbered byte payloads ("versions") held in one native store and served to
pullers, each chunk tagged so that no process without the run's secret can alter it. It
has two users: the trainer's weight versions (publisher.py lays tensors out in a version
and adds deltas) and migration batches (a rollout instance serves the packed samples it
hands off, rlboost/migration/sender.py). pull_bytes() is the other end for a plain payload.
"""

from __future__ import annotations

import numpy as np
import torch

from rlboost import _C
from rlboost.errors import ProtocolError, TransferClosed
from rlboost.transfer import descriptors
from rlboost.transfer.closing import Closing
from rlboost.transfer.config import ServerConfig, TransferConfig, advertised_host, format_address
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.puller import WeightPuller
from rlboost.transfer.server import start_server

PAYLOAD_NAME = "payload"  # the one tensor of a plain byte payload


class VersionServer(Closing):
    """A store of numbered byte payloads and the server that hands them out.

    stage(version, manifest) gives the writable region of a version laid out by manifest;
    commit(version, manifest) tags its chunks and starts serving it (the `role` keeps its
    versions_kept newest); retire(version) stops serving one. serve_bytes() does all three
    for a plain payload.
    """

    def __init__(self, config: TransferConfig, role: ServerConfig):
        self.config, self.role = config, role
        self._secret = config.require_secret()
        self.store = _C.VersionStore(versions_kept=role.versions_kept, secret=self._secret)
        self._server = start_server(self.store, config, role, self._secret)
        self._staged: dict[int, object] = {}
        self._closed = False

    @property
    def address(self) -> str:
        """Where pullers connect: "host:port"."""
        return format_address(advertised_host(self.config, self._server.host), self._server.port)

    @property
    def secret(self) -> bytes:
        return self._secret

    def keys(self) -> list[int]:
        """Every payload served now (delta keys included)."""
        return list(self.store.versions())

    @property
    def latest(self) -> int | None:
        v = self.store.latest()
        return None if v < 0 else v

    def stage(self, version: int, manifest: Manifest) -> torch.Tensor:
        """The writable bytes of `version` (a staging region the store owns)."""
        self._check_open()
        if version in self._staged:
            raise ValueError(f"version {version} is already staged")
        region = self.store.stage(version, manifest.total_bytes)
        self._staged[version] = region
        return descriptors.region_tensor(region)

    def commit(self, version: int, manifest: Manifest) -> Manifest:
        """Tags the staged bytes and starts serving `version`; returns its manifest with the
        chunk table."""
        self._check_open()
        if version not in self._staged:
            raise ValueError(f"version {version} was not staged")
        try:
            native = self.store.commit(version, self.config.chunk_bytes, manifest.to_bytes(),
                                       self.config.commit_threads)
        finally:
            self.discard(version)
        return manifest.with_chunks(version, native.chunk_bytes, native.tags)

    def discard(self, version: int) -> None:
        """Drops a staged version that will not be committed."""
        if self._staged.pop(version, None) is not None:
            self.store.discard_staged(version)

    def retire(self, version: int, timeout: float | None = None) -> None:
        """Stops serving `version`, waiting until no read of it is in flight."""
        self.store.retire(version, self.config.request_timeout_s if timeout is None else timeout)

    def serve_bytes(self, version: int, payload: bytes) -> Manifest:
        """Serves a plain payload as `version`: one uint8 tensor, staged with one copy."""
        manifest = Manifest.from_layout(version, [(PAYLOAD_NAME, "uint8", (len(payload),))], self.config.alignment)
        staged = self.stage(version, manifest)
        try:
            staged.numpy()[:len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        except BaseException:
            self.discard(version)
            raise
        return self.commit(version, manifest)

    def stats(self) -> dict:
        """Server counters (bytes_sent, chunks_sent, auth_failures, protocol_errors, ...),
        plus held_bytes: the memory of every version held (served, still read, staged)."""
        out = self._server.stats()
        out["held_bytes"] = self.store.held_bytes()
        return out

    def close(self) -> None:
        """Stops serving and joins every server thread. Idempotent."""
        if not self._closed:
            self._closed = True
            self._server.close()
            self._staged.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise TransferClosed("server is closed")


def pull_bytes(puller: WeightPuller, address: str, version: int, nbytes: int, timeout: float | None) -> np.ndarray:
    """Pulls the plain payload `version` (nbytes long) from `address` into a fresh numpy
    buffer (huge-page backed, so first touch is cheap)."""
    buffer = np.empty(nbytes, dtype=np.uint8)
    pulled = puller.pull(version=version, into=torch.from_numpy(buffer), timeout=timeout, sources=address)
    if pulled.manifest.total_bytes != nbytes:
        raise ProtocolError(f"payload {version} holds {pulled.manifest.total_bytes} bytes, the ticket says {nbytes}")
    puller.retire(version)  # a relaying puller would otherwise keep serving it
    return buffer
