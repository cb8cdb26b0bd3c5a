"""Relay: what a puller re-serves to its peers. Every version (and delta) it holds is served
straight from the buffer it was pulled into, even while the pull still runs, from a
version store and server of its own (the relay role's limits). A version left behind
while peers still read it is served until their last read ends, then released
(retiring); at most two buffers of one payload's size are held that way.
"""

from __future__ import annotations

import threading

import torch

from rlboost import _C
from rlboost.transfer import descriptors
from rlboost.transfer.config import TransferConfig, advertised_host, format_address
from rlboost.transfer.delta import is_delta_key
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.server import start_server


class Relay:
    """The versions one puller serves to its peers, and the server they pull them from."""

    def __init__(self, config: TransferConfig, secret: bytes):
        self.config = config
        self.store = _C.VersionStore(versions_kept=config.relay_server.versions_kept, secret=secret)
        self._server = start_server(self.store, config, config.relay_server, secret)
        self._served: dict[int, tuple[torch.Tensor, object | None]] = {}  # version -> (buffer, region)
        self._retiring: set[int] = set()
        self._lock = threading.RLock()  # shared by pulls, and delta pulls on threads of their own

    @property
    def address(self) -> str:
        """Where peers pull what this relay serves."""
        return format_address(advertised_host(self.config, self._server.host), self._server.port)

    @property
    def server_id(self) -> int:
        """Its server's id, so that its own puller never pulls from it."""
        return self._server.server_id

    @property
    def versions(self) -> list[int]:
        with self._lock:
            self.sweep()
            return sorted(v for v in self._served if not is_delta_key(v))

    @property
    def deltas(self) -> list[int]:
        """Target versions of the deltas it serves."""
        with self._lock:
            return sorted(v & ~_C.DELTA["key_bit"] for v in self._served if is_delta_key(v))

    def serve(self, native_manifest, buffer: torch.Tensor, region: object | None, *, complete: bool = False) -> int:
        """Serves a buffer as native_manifest.version (a delta's key, or a full version whose
        buffer is taken back from whatever it held), partial until its pull fills it unless
        `complete`; returns the registration id its pull reports chunks to."""
        with self._lock:
            self.claim(buffer, native_manifest.version)
            # Versions (and, apart, deltas) beyond versions_kept go at once unless peers are
            # reading them; those are served until their reads end rather than waited for.
            delta = is_delta_key(native_manifest.version)
            kept = [v for v in sorted(self._served) if v not in self._retiring and is_delta_key(v) == delta]
            for v in kept[: max(0, len(kept) - self.config.relay_server.versions_kept + 1)]:
                if not self._retire_if_idle(v):
                    self._retiring.add(v)
            if region is not None:
                registration = self.store.add_partial(native_manifest, region, complete)
            else:
                addr, nbytes = descriptors.describe(buffer)
                registration = self.store.add_partial_borrowed(native_manifest, addr, nbytes, complete)
            self._served[native_manifest.version] = (buffer, region)
            return registration

    def claim(self, buffer: torch.Tensor, version: int | None = None) -> None:
        """Stops serving `version` and whatever `buffer` holds (waiting for reads in flight):
        what is about to change in place."""
        with self._lock:
            for v, (buf, _) in list(self._served.items()):
                if v == version or descriptors.same_memory(buf, buffer):
                    self.retire(v)

    def retire(self, version: int) -> None:
        """Stops serving `version` (waits for reads in flight) and releases its buffer."""
        with self._lock:
            if version in self._served:
                self.store.retire(version, self.config.request_timeout_s)
                del self._served[version]
                self._retiring.discard(version)

    def spare_for(self, buffer: torch.Tensor, region: object | None,
                  manifest: Manifest) -> tuple[torch.Tensor, object, bytes] | None:
        """A fresh buffer for a pull of `manifest` into `buffer` while peers still read that
        buffer (one its puller allocated: `region`): its version stays served until they
        finish, then is released. None when the buffer is free (reused at once), not the
        puller's, or when an older buffer is still being read: then the pull waits for the
        readers as usual, so never more than two buffers are held."""
        total = manifest.total_bytes
        if region is None or buffer.numel() < total:
            return None
        with self._lock:
            self.sweep()
            held = [v for v, (buf, _) in self._served.items() if descriptors.same_memory(buf, buffer)]
            busy = [v for v in held if not self._retire_if_idle(v)]
            # The same version cannot be served from two buffers: that one is waited for.
            if not busy or self._retiring or manifest.version in busy:
                return None
            self._retiring.update(busy)
        region = _C.Region.create(total)
        return descriptors.region_tensor(region), region, b""

    def sweep(self) -> None:
        """Releases the left-behind versions whose last read has ended."""
        with self._lock:
            for v in list(self._retiring):
                if v not in self._served or self._retire_if_idle(v):
                    self._retiring.discard(v)

    def _retire_if_idle(self, version: int) -> bool:
        """Retires a served version no read holds (True); False while one does."""
        if not self.store.retire_if_idle(version):
            return False
        self._served.pop(version, None)
        return True

    def stats(self) -> dict:
        """Server counters, plus ``reads_in_flight`` (version -> reads holding it) and
        ``retiring_versions`` (left behind, served until their readers finish)."""
        with self._lock:
            self.sweep()
            out = self._server.stats()
            out["reads_in_flight"] = self.store.pins()
            out["retiring_versions"] = sorted(self._retiring)
            return out

    def close(self) -> None:
        self._server.close()
        with self._lock:
            self._served.clear()
            self._retiring.clear()
