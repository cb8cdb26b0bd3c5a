"""WeightPuller: the receiving side. It connects out to its sources (the trainer's
publisher and peers' relays), pulls a version into a buffer, and re-serves what it holds
through its Relay (transfer/relay.py), even while the pull is still running. Its
authenticated connections stay open between pulls (``keep_connections``), so small pulls
are cheap. A pull into the previous result (``into=pulled``) takes the deltas from the
version held there when the publisher serves them (transfer/delta_pull.py), the full
version otherwise; a pull that failed part way is resumed by the next try.
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
from rlboost.transfer.config import ENCRYPT_CODES, TransferConfig, format_address, parse_address, warn_if_clear_text
from rlboost.transfer.delta_pull import DeltaPullHandle
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.progress import ProgressCallback
from rlboost.transfer.pulled import PartialPulls, PulledWeights, PullHandle
from rlboost.transfer.relay import Relay

Into = torch.Tensor | PulledWeights | None


class WeightPuller(Closing):
    """Pulls weight versions from one or more sources ("host:port")."""

    def __init__(self, sources: str | Sequence[str] = (), config: TransferConfig | None = None):
        self.config = config = config if config is not None else TransferConfig()
        self._secret = config.require_secret()
        self._sources = self._parse(sources)
        warn_if_clear_text(config, [h for h, _ in self._sources])
        self._partial = PartialPulls()
        self._handles: weakref.WeakSet[PullHandle] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        c = self.config
        # Per source: one connection per stream, the control one and a long-poll one.
        self._pool = (_C.ConnectionPool(max_idle_per_source=c.streams + 2, max_idle_s=c.connection_idle_s)
                      if c.keep_connections else None)
        self.relay = Relay(c, self._secret) if c.relay else None

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
        return self.relay.address if self.relay is not None else None

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
        buffer, region, seed = self._destination(manifest, into)
        handle = PullHandle(native, plan, manifest, buffer, region, seed, progress, relay=self.relay,
                            partial=self._partial)
        if self._delta_base(manifest, into, seed):
            handle = DeltaPullHandle(handle, into, native, c, relay=self.relay, secret=self._secret)
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
        return self.relay.versions if self.relay is not None else []

    @property
    def relayed_deltas(self) -> list[int]:
        """Target versions of the deltas this puller re-serves."""
        return self.relay.deltas if self.relay is not None else []

    def retire(self, version: int) -> None:
        """Stops relaying `version` (waits for reads in flight) and releases its buffer."""
        if self.relay is not None:
            self.relay.retire(version)

    def stats(self) -> dict:
        """The relay's counters (relay.Relay.stats); empty when relay is off."""
        return self.relay.stats() if self.relay is not None else {}

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
        if self.relay is not None:
            self.relay.close()
        self._partial.clear()

    # ---- internals ---------------------------------------------------------------
    def _native(self, sources: list[tuple[str, int]], streams: int, max_in_flight: int, reconnects: int):
        c = self.config
        return _C.Puller(sources=sources, secret=self._secret, transport=c.transport, streams=streams,
                         max_in_flight=max_in_flight, request_timeout_s=c.request_timeout_s,
                         connect_timeout_s=c.connect_timeout_s, reconnect_attempts=reconnects,
                         self_server_id=self.relay.server_id if self.relay is not None else 0, pool=self._pool,
                         relay_poll_ms=c.relay_poll_ms, encrypt=ENCRYPT_CODES[c.encrypt],
                         max_version_bytes=c.max_version_bytes)

    def _destination(self, manifest: Manifest, into: Into) -> tuple[torch.Tensor, object | None, bytes]:
        """The buffer a pull of `manifest` fills, its native region (when this puller
        allocates it), and the chunks it already holds (a failed pull's, to resume)."""
        total = manifest.total_bytes
        failed = self._partial.find(manifest)
        region = None
        if into is None:
            if failed is not None:
                return failed
            region = _C.Region.create(total)
            return descriptors.region_tensor(region), region, b""
        if isinstance(into, PulledWeights):
            spare = self.relay.spare_for(into.buffer, into.region, manifest) if self.relay is not None else None
            if spare is not None:
                return spare
            into, region = into.buffer, into.region
        buffer = descriptors.byte_view(into)
        if buffer.numel() < total:
            raise ValueError(f"into: holds {buffer.numel()} bytes, the payload needs {total}")
        buffer = buffer[:total]
        same = failed is not None and descriptors.describe(failed[0]) == descriptors.describe(buffer)
        return buffer, region, failed[2] if same else b""

    def _check_open(self) -> None:
        if self._closed:
            raise TransferClosed("puller is closed")

    @staticmethod
    def _parse(sources: str | Sequence[str]) -> list[tuple[str, int]]:
        if isinstance(sources, str):
            sources = [sources]
        return [parse_address(s) for s in sources]
