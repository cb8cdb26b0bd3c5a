"""WeightPuller: the receiving side. It connects out to its sources (the trainer's
publisher and peers' relays), pulls a version into a buffer, and re-serves what it holds
through its own relay server, even while the pull is still running. Its authenticated
connections stay open between pulls (``keep_connections``), so small pulls are cheap.
A pull into the previous result (``into=pulled``) takes the deltas from the version held
there when the publisher serves them (transfer/delta_pull.py), the full version otherwise.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import torch

from rlboost import _C
from rlboost.errors import ProtocolError, TransferClosed
from rlboost.transfer import descriptors
from rlboost.transfer.closing import Closing
from rlboost.transfer.config import (
    ENCRYPT_CODES,
    TransferConfig,
    advertised_host,
    format_address,
    parse_address,
    warn_if_clear_text,
)
from rlboost.transfer.delta import is_delta_key
from rlboost.transfer.delta_pull import DeltaHooks, DeltaPullHandle
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.progress import ProgressCallback
from rlboost.transfer.pulled import PulledWeights, PullHandle, PullHooks
from rlboost.transfer.server import start_server

Into = torch.Tensor | PulledWeights | None


class WeightPuller(Closing):
    """Pulls weight versions from one or more sources ("host:port")."""

    def __init__(self, sources: str | Sequence[str] = (), config: TransferConfig | None = None):
        self.config = config = config if config is not None else TransferConfig()
        self._secret = config.require_secret()
        self._sources = self._parse(sources)
        warn_if_clear_text(config, [h for h, _ in self._sources])
        self._relayed: dict[int, tuple[torch.Tensor, object | None]] = {}
        # Relayed versions left behind while peers still read them: served until their
        # last read ends, then released (see _spare_for).
        self._retiring: set[int] = set()
        self._failed: dict[int, tuple[torch.Tensor, object | None, bytes, bytes]] = {}
        self._handles: weakref.WeakSet[PullHandle] = weakref.WeakSet()
        # Relay bookkeeping is shared with delta pulls, which run on threads of their own.
        self._lock = threading.RLock()
        self._closed = False
        self._relay_store = self._relay_server = None
        self._hooks = PullHooks(register_relay=self._register_relay, retire=self.retire,
                                failed=self._remember_failed, succeeded=self._forget_failed)
        # A delta that fails is not resumed: the full version is pulled instead.
        self._payload_hooks = PullHooks(register_relay=self._register_relay, retire=self.retire,
                                        failed=lambda handle, held: None, succeeded=lambda version: None)
        self._delta_hooks = DeltaHooks(payload=self._start_payload, claim=self._claim,
                                       complete=self._serve_complete, secret=self._secret)
        c = self.config
        # Per source: one connection per stream, the control one and a long-poll one.
        self._pool = (_C.ConnectionPool(max_idle_per_source=c.streams + 2, max_idle_s=c.connection_idle_s)
                      if c.keep_connections else None)
        if c.relay:
            self._relay_store = _C.VersionStore(versions_kept=c.relay_server.versions_kept, secret=self._secret)
            self._relay_server = start_server(self._relay_store, c, c.relay_server, self._secret)

    # ---- sources -----------------------------------------------------------------
    @property
    def sources(self) -> list[str]:
        return [format_address(h, p) for h, p in self._sources]

    def set_sources(self, sources: str | Sequence[str]) -> None:
        """Replaces the sources used by later pulls (e.g. once peers' relays are known)."""
        self._sources = self._parse(sources)
        warn_if_clear_text(self.config, [h for h, _ in self._sources])

    @property
    def relay_address(self) -> str | None:
        """Where peers can pull what this process holds, or None when relay is off."""
        if self._relay_server is None:
            return None
        return format_address(advertised_host(self.config, self._relay_server.host), self._relay_server.port)

    # ---- pulling -----------------------------------------------------------------
    def prepare(self, version: int | None = None, into: Into = None,
                progress: ProgressCallback | bool | None = None,
                sources: str | Sequence[str] | None = None) -> PullHandle | DeltaPullHandle:
        """Resolves `version` (None: the newest any source holds) and sizes the destination.

        Sources that do not answer within ``resolve_timeout_s`` (or fail) are left out and
        listed in the handle's ``skipped_sources``; TransferTimeout when none answers.

        `into`: a contiguous CPU tensor (or a previous PulledWeights, whose version then
        serves as the base of deltas when ``config.delta`` and the publisher serves them) to receive into; None
        allocates shared memory. While relay is on, the buffer is re-served to peers until
        this version is retired (``retire(version)``): do not modify it before then. When
        `into` is a PulledWeights whose buffer this puller allocated and peers are still
        reading it, the pull goes to a second buffer instead of waiting for them (the
        result's ``buffer`` then differs from `into`'s); the two alternate, so at most
        twice the payload is held.
        `progress`: a callback (bytes_done, total_bytes), or True for a tqdm bar.
        Returns a handle to start() and wait() on.
        """
        self._check_open()
        addrs = self._parse(sources) if sources is not None else self._sources
        c = self.config
        native = self._native(addrs, c.streams, c.max_in_flight, c.reconnect_attempts)
        plan = native.resolve(-1 if version is None else version, c.request_timeout_s, c.resolve_timeout_s)
        nm = plan.manifest
        manifest = Manifest.from_bytes(nm.meta, nm.version, nm.chunk_bytes, nm.tags)
        if manifest.total_bytes != nm.total_bytes:
            raise ProtocolError("tensor table and chunk table disagree on the payload size")
        with self._lock:
            buffer, region, seed = self._destination(manifest, into)
        handle = PullHandle(self._hooks, native, plan, manifest, buffer, region, seed, progress)
        if self._delta_base(manifest, into, seed):
            handle = DeltaPullHandle(self._delta_hooks, handle, into, native, c)
        with self._lock:
            self._handles.add(handle)
        return handle

    def pull(self, version: int | None = None, into: Into = None, timeout: float | None = None,
             progress: ProgressCallback | bool | None = None,
             sources: str | Sequence[str] | None = None) -> PulledWeights:
        """Pulls a version and returns its named tensor views (blocking)."""
        handle = self.prepare(version, into=into, progress=progress, sources=sources).start()
        try:
            return handle.wait(timeout)
        except BaseException:
            handle.cancel()
            raise

    def _delta_base(self, manifest: Manifest, into: Into, seed: bytes) -> bool:
        """Whether `into` holds a version that deltas can bring up to `manifest`: an earlier
        one of the same layout, within delta_max_chain, when the publisher announced a
        delta. Not when the destination holds part of an earlier attempt at this version."""
        c = self.config
        return (c.delta and isinstance(into, PulledWeights) and manifest.delta_base is not None and not seed
                and into.version < manifest.version <= into.version + c.delta_max_chain
                and into.manifest.same_layout(manifest) and len(into.manifest.chunk_tags) > 0)

    def latest_version(self) -> int:
        """The newest version any source holds complete."""
        self._check_open()
        c = self.config
        return self._native(self._sources, 1, 1, 0).resolve(-1, c.request_timeout_s,
                                                              c.resolve_timeout_s).manifest.version

    # ---- relay -------------------------------------------------------------------
    @property
    def relayed_versions(self) -> list[int]:
        with self._lock:
            self._sweep()
            return sorted(v for v in self._relayed if not is_delta_key(v))

    @property
    def relayed_deltas(self) -> list[int]:
        """Target versions of the deltas this puller re-serves."""
        with self._lock:
            return sorted(v & ~_C.DELTA["key_bit"] for v in self._relayed if is_delta_key(v))

    def retire(self, version: int) -> None:
        """Stops relaying `version` (waits for reads in flight) and releases its buffer."""
        with self._lock:
            if self._relay_store is not None and version in self._relayed:
                self._relay_store.retire(version, self.config.request_timeout_s)
                del self._relayed[version]
                self._retiring.discard(version)

    def stats(self) -> dict:
        """Relay server counters, plus ``reads_in_flight`` (version -> reads holding it)
        and ``retiring_versions`` (left behind, served until their readers finish); empty
        when relay is off."""
        if self._relay_server is None:
            return {}
        with self._lock:
            self._sweep()
        out = self._relay_server.stats()
        out["reads_in_flight"] = self._relay_store.pins()
        out["retiring_versions"] = sorted(self._retiring)
        return out

    @property
    def idle_connections(self) -> int:
        """Authenticated connections to sources kept open for the next pull."""
        return self._pool.idle if self._pool is not None else 0

    def close(self) -> None:
        """Cancels running pulls and stops the relay server. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for handle in list(self._handles):
            handle.cancel()
        if self._pool is not None:
            self._pool.close()
        if self._relay_server is not None:
            self._relay_server.close()
        self._relayed.clear()
        self._retiring.clear()
        self._failed.clear()

    # ---- internals used by PullHandle ----------------------------------------------
    def _native(self, sources: list[tuple[str, int]], streams: int, max_in_flight: int, reconnects: int):
        c = self.config
        return _C.Puller(sources=sources, secret=self._secret, transport=c.transport, streams=streams,
                         max_in_flight=max_in_flight, request_timeout_s=c.request_timeout_s,
                         connect_timeout_s=c.connect_timeout_s, reconnect_attempts=reconnects,
                         self_server_id=self._self_id, pool=self._pool, relay_poll_ms=c.relay_poll_ms,
                         encrypt=ENCRYPT_CODES[c.encrypt], max_version_bytes=c.max_version_bytes)

    @property
    def _self_id(self) -> int:
        """This process's relay server id, so it never pulls from itself (0: no relay)."""
        return self._relay_server.server_id if self._relay_server is not None else 0

    def _register_relay(self, handle: PullHandle) -> tuple[object | None, int]:
        """Serves the handle's buffer as a partial version: (store, registration id)."""
        if self._relay_store is None:
            return None, 0
        with self._lock:
            return self._relay_store, self._serve(handle.native_manifest, handle.buffer, handle._region, False)

    def _serve(self, nm, buffer: torch.Tensor, region: object | None, complete: bool) -> int:
        """Serves a buffer as version nm.version (a delta's key, or a full version whose
        buffer is taken back from whatever it held); returns the registration id."""
        self._claim(buffer, nm.version)
        # Versions (and, apart, deltas) beyond versions_kept go at once unless peers are
        # reading them; those are served until their reads end rather than waited for.
        delta = is_delta_key(nm.version)
        kept = [v for v in sorted(self._relayed) if v not in self._retiring and is_delta_key(v) == delta]
        for v in kept[: max(0, len(kept) - self.config.relay_server.versions_kept + 1)]:
            if not self._retire_if_idle(v):
                self._retiring.add(v)
        if region is not None:
            registration = self._relay_store.add_partial(nm, region, complete)
        else:
            addr, nbytes = descriptors.describe(buffer)
            registration = self._relay_store.add_partial_borrowed(nm, addr, nbytes, complete)
        self._relayed[nm.version] = (buffer, region)
        return registration

    def _claim(self, buffer: torch.Tensor, version: int | None = None) -> None:
        """Stops relaying `version` and whatever `buffer` holds (waiting for reads in flight)."""
        with self._lock:
            for v, (buf, _) in list(self._relayed.items()):
                if v == version or descriptors.same_memory(buf, buffer):
                    self.retire(v)

    def _serve_complete(self, nm, buffer: torch.Tensor, region: object | None) -> None:
        """Relays a version this puller rebuilt from deltas (every chunk held)."""
        if self._relay_store is not None:
            with self._lock:
                self._serve(nm, buffer, region, True)

    def _start_payload(self, native, plan, manifest: Manifest) -> PullHandle:
        """Starts pulling a delta payload into fresh memory (relayed while it arrives)."""
        region = _C.Region.create(manifest.total_bytes)
        handle = PullHandle(self._payload_hooks, native, plan, manifest, descriptors.region_tensor(region),
                            region, b"", None)
        with self._lock:
            self._handles.add(handle)
        return handle.start()

    def _remember_failed(self, handle: PullHandle, held: bytes) -> None:
        self._failed[handle.version] = (handle.buffer, handle._region, held, handle.manifest.chunk_tags)

    def _forget_failed(self, version: int) -> None:
        self._failed.pop(version, None)

    def _destination(self, manifest: Manifest, into: Into) -> tuple[torch.Tensor, object | None, bytes]:
        total = manifest.total_bytes
        failed = self._failed.get(manifest.version)
        resumable = failed is not None and failed[3] == manifest.chunk_tags
        region = None
        if into is None:
            if resumable:
                return failed[0], failed[1], failed[2]
            region = _C.Region.create(total)
            return descriptors.region_tensor(region), region, b""
        if isinstance(into, PulledWeights):
            spare = self._spare_for(into, manifest)
            if spare is not None:
                return spare
            into, region = into.buffer, into._region
        buffer = descriptors.byte_view(into)
        if buffer.numel() < total:
            raise ValueError(f"into: holds {buffer.numel()} bytes, the payload needs {total}")
        buffer = buffer[:total]
        same = resumable and descriptors.describe(failed[0]) == descriptors.describe(buffer)
        return buffer, region, failed[2] if same else b""

    def _spare_for(self, into: PulledWeights, manifest: Manifest) -> tuple[torch.Tensor, object, bytes] | None:
        """A fresh buffer when peers still read the one `into` names (which this puller
        allocated): its version stays served until they finish, then is released. None
        when that buffer is free (reused at once), not this puller's, or when an older
        buffer is still being read: then the pull waits for `into`'s readers as usual, so
        never more than two buffers are held."""
        total = manifest.total_bytes
        if into._region is None or self._relay_store is None or into.buffer.numel() < total:
            return None
        self._sweep()
        held = [v for v, (buf, _) in self._relayed.items() if descriptors.same_memory(buf, into.buffer)]
        busy = [v for v in held if not self._retire_if_idle(v)]
        # The same version cannot be served from two buffers: that one is waited for.
        if not busy or self._retiring or manifest.version in busy:
            return None
        self._retiring.update(busy)
        region = _C.Region.create(total)
        return descriptors.region_tensor(region), region, b""

    def _retire_if_idle(self, version: int) -> bool:
        """Retires a relayed version no read holds (True); False while one does."""
        if not self._relay_store.retire_if_idle(version):
            return False
        self._relayed.pop(version, None)
        return True

    def _sweep(self) -> None:
        """Releases the left-behind versions whose last read has ended."""
        for v in list(self._retiring):
            if v not in self._relayed or self._retire_if_idle(v):
                self._retiring.discard(v)

    def _check_open(self) -> None:
        if self._closed:
            raise TransferClosed("puller is closed")

    @staticmethod
    def _parse(sources: str | Sequence[str]) -> list[tuple[str, int]]:
        if isinstance(sources, str):
            sources = [sources]
        return [parse_address(s) for s in sources]
