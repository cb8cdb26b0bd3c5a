"""DeltaPullHandle: a pull that brings a held version up to date with deltas.

It resolves the chain of deltas from the version the puller holds to the one asked for
(waiting, up to ``delta_wait_s``, for the newest one its publisher announced), pulls them
from whichever sources hold them (trainer or relays, which re-serve them too), applies
them to a copy of the held version, and accepts the result only if every chunk matches
the full version's own tags. Anything else -- no delta, a chain too long or larger than
the full version, a delta that fails its tags, a result that does not match -- ends in
the full version's pull instead, never in other weights.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from rlboost import _C
from rlboost.errors import (
    IntegrityError,
    ProtocolError,
    TransferClosed,
    TransferError,
    TransferTimeout,
    VersionMismatch,
)
from rlboost.transfer import descriptors
from rlboost.transfer.config import TransferConfig
from rlboost.transfer.delta import apply_deltas, delta_key, mismatched_chunks, tags_digest
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.pulled import PulledWeights, PullHandle

if TYPE_CHECKING:
    from rlboost.transfer.relay import Relay

_AWAIT_SLICE_S = 1.0


class DeltaPullHandle:
    """Like PullHandle (``start()``, ``poll()``, ``wait()``, ``cancel()``), for a puller that
    holds an earlier version of the same layout. relay: the puller's, which serves the
    deltas as they arrive and the rebuilt version once checked; secret: the run's, which
    the rebuilt bytes' tags are checked with."""

    def __init__(self, full: PullHandle, base: PulledWeights, native_puller, config: TransferConfig, *,
                 relay: Relay | None, secret: bytes):
        self.manifest, self.version, self.buffer = full.manifest, full.version, full.buffer
        self.native_manifest = full.native_manifest
        self.skipped_sources = full.skipped_sources
        self._full, self._base, self._native, self._config = full, base, native_puller, config
        self._relay, self._secret = relay, secret
        self._payloads: list[PullHandle] = []
        self._current: PullHandle | None = None
        self._thread: threading.Thread | None = None
        self._finished = threading.Event()
        self._cancelled = False
        self._result: PulledWeights | None = None
        self._error: BaseException | None = None
        self._fallback: str | None = None
        self._timings: dict[str, float] = {}

    @property
    def total_bytes(self) -> int:
        return self.manifest.total_bytes

    @property
    def bytes_done(self) -> int:
        return sum(h.bytes_done for h in self._payloads) + self._full.bytes_done

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def start(self) -> "DeltaPullHandle":
        if self._thread is not None:
            raise ValueError("pull already started")
        self._thread = threading.Thread(target=self._run, name=f"delta-pull-v{self.version}", daemon=True)
        self._thread.start()
        return self

    def poll(self, timeout: float = 0.0) -> bool:
        """True once the pull has ended (succeeded or failed), False while it goes on."""
        if self._thread is None:
            self.start()
        return self._finished.wait(timeout)

    def wait(self, timeout: float | None = None) -> PulledWeights:
        """The pulled version; TransferTimeout after `timeout` s (the pull goes on), or the
        full pull's own error."""
        if not self.poll(0.0) and not self._finished.wait(timeout):
            raise TransferTimeout(f"pull of version {self.version} not done after {timeout} s "
                                  f"({self.bytes_done} bytes so far)")
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self) -> None:
        """Stops the pull; a later wait() raises TransferClosed."""
        self._cancelled = True
        current = self._current
        if current is not None:
            current.cancel()

    def stats(self) -> dict:
        """The full pull's statistics when it fell back to one; either way ``route``
        ("delta" or "full"), ``bytes`` (all fetched, deltas included), ``delta_bytes``,
        ``deltas`` (how many were applied), ``fallback`` (why not, or None), per source
        ``bytes``, and apply_s / verify_s."""
        fetched = [h.stats() for h in self._payloads]
        if self._fallback is not None and self._full.started:
            fetched.append(self._full.stats())
        out = {"route": "full" if self._fallback is not None else "delta", "fallback": self._fallback,
               "deltas": 0 if self._fallback is not None else len(self._payloads),
               "delta_bytes": sum(h.bytes_done for h in self._payloads),
               "sources": _merge_sources(fetched), "skipped_sources": list(self.skipped_sources),
               **self._timings}
        out["bytes"] = sum(s["bytes"] for s in out["sources"])
        return out

    def __enter__(self) -> "DeltaPullHandle":
        return self

    def __exit__(self, *exc) -> None:
        if not self.done:
            self.cancel()

    # ---- the pull, on its own thread ------------------------------------------------
    def _run(self) -> None:
        try:
            try:
                self._result = self._via_deltas()
            except TransferError as exc:  # a missing, corrupt or wrong delta: the full version
                if self._cancelled:
                    raise
                self._fallback = f"{type(exc).__name__}: {exc}"
            if self._result is None:
                self._result = self._wait(self._full.start())
                self._result.stats = self.stats()  # the deltas tried count too
        except BaseException as exc:  # handed to wait()
            self._error = TransferClosed("pull cancelled") if self._cancelled else exc
        finally:
            self._current = None
            self._finished.set()

    def _via_deltas(self) -> PulledWeights | None:
        route = self._route()
        if route is None:
            return None
        deltas = [self._wait(self._payload(plan, m)).buffer for plan, m in route]
        dst, base = self.buffer, descriptors.byte_view(self._base.buffer, "base")[: self.total_bytes]
        if descriptors.same_memory(dst, base) and self._relay is not None:
            self._relay.claim(dst)  # its old version is about to change in place
        t0 = time.perf_counter()
        apply_deltas(deltas, base, dst, self._config.delta_threads)
        t1 = time.perf_counter()
        bad = mismatched_chunks(self.native_manifest, dst, self._secret, self._config.delta_threads)
        self._timings = {"apply_s": t1 - t0, "verify_s": time.perf_counter() - t1}
        if bad:
            raise IntegrityError(f"version {self.version} rebuilt from deltas differs from its tags in "
                                 f"{len(bad)} chunks (first {bad[0]})")
        region = self._full.region
        if self._relay is not None:  # every chunk is held: served whole
            self._relay.serve(self.native_manifest, dst, region, complete=True)
        return PulledWeights(self.manifest, dst, region, self.stats())

    def _payload(self, plan, manifest: Manifest) -> PullHandle:
        """Starts pulling a delta payload into fresh memory (relayed while it arrives; a
        delta that fails is not resumed: the full version is pulled instead)."""
        region = _C.Region.create(manifest.total_bytes)
        return PullHandle(self._native, plan, manifest, descriptors.region_tensor(region), region, b"", None,
                          relay=self._relay).start()

    def _route(self) -> list[tuple[object, Manifest]] | None:
        """(plan, table) of each delta from the held version to the target, oldest first;
        None when there is no such chain worth pulling."""
        held, route = self._base.manifest, []
        want = self.version
        while True:
            plan = self._resolve(want, wait=want == self.version)
            if plan is None:
                raise TransferError(f"no source serves a delta into version {want}")
            nm = plan.manifest
            m = Manifest.from_bytes(nm.meta, nm.version, nm.chunk_bytes, nm.tags)
            if m.delta is None or m.delta.target != want:
                raise ProtocolError(f"the payload served as the delta into version {want} is not one")
            if m.delta.declined:
                raise TransferError(f"the publisher declined the delta into version {want} (it would have "
                                    f"been larger than delta_max_fraction of the version)")
            route.insert(0, (plan, m))
            if m.delta.base == held.version:
                break
            if m.delta.base < held.version or len(route) >= self._config.delta_max_chain:
                raise TransferError(f"no chain of at most {self._config.delta_max_chain} deltas from version "
                                    f"{held.version} to {self.version}")
            want = m.delta.base
        specs = [m.delta for _, m in route]
        chained = all(a.target_tags == b.base_tags for a, b in zip(specs, specs[1:]))
        if specs[0].base_tags != tags_digest(held.chunk_tags) or not chained or \
                specs[-1].target_tags != tags_digest(self.manifest.chunk_tags):
            raise TransferError("the deltas were not computed from the version held here or not into the one "
                                "asked for")
        if sum(m.total_bytes for _, m in route) >= self.total_bytes:
            raise TransferError("the deltas are no smaller than the full version")
        return route

    def _resolve(self, target: int, wait: bool):
        """The resolved plan of the delta into `target`, or None when no source serves it
        (after waiting for it up to delta_wait_s when `wait`)."""
        c, key = self._config, delta_key(target)
        deadline = time.monotonic() + (c.delta_wait_s if wait else 0.0)
        while not self._cancelled:
            try:
                return self._native.resolve(key, c.request_timeout_s, c.resolve_timeout_s)
            except VersionMismatch:  # not served yet
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # In slices, so that cancel() is heard within one.
            self._native.await_version(key, min(left, _AWAIT_SLICE_S))
        raise TransferClosed("pull cancelled")

    def _wait(self, handle: PullHandle) -> PulledWeights:
        """Waits for a started pull, in slices, so that cancel() ends it."""
        self._current = handle
        if handle is not self._full:
            self._payloads.append(handle)
        if self._cancelled:
            handle.cancel()
        while not handle.poll(0.25):
            if self._cancelled:
                handle.cancel()
        return handle.wait()


_COUNTS = ("bytes", "chunks", "not_held", "integrity_failures", "reconnects")


def _merge_sources(stats: list[dict]) -> list[dict]:
    """Per source address, the counts of several pulls added up (and the first error)."""
    merged: dict[str, dict] = {}
    for s in stats:
        for src in s.get("sources", []):
            into = merged.get(src["address"])
            if into is None:
                merged[src["address"]] = dict(src)
                continue
            for key in _COUNTS:
                into[key] = into.get(key, 0) + src.get(key, 0)
            into["error"] = into.get("error") or src.get("error", "")
    return list(merged.values())
