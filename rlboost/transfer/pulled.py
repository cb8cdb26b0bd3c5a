"""PullHandle (prepare -> start -> wait), PulledWeights (the named tensor views over a
received buffer) and PartialPulls (what failed pulls already hold, for the next try). A
handle serves its buffer through its puller's relay while the bytes arrive."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch

from rlboost.errors import TransferError, TransferTimeout
from rlboost.transfer import descriptors
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.progress import ProgressCallback, TqdmProgress

if TYPE_CHECKING:
    from rlboost.transfer.relay import Relay


class PulledWeights(Mapping[str, torch.Tensor]):
    """A pulled version: name -> tensor views over one received buffer (zero-copy).

    The views share memory with ``buffer``; pass ``into=this`` to the next pull to reuse it.
    ``region`` is the native memory behind the buffer when the puller allocated it (None
    when the caller gave the buffer).
    """

    def __init__(self, manifest: Manifest, buffer: torch.Tensor, region: object | None, stats: dict):
        self.manifest = manifest
        self.version = manifest.version
        self.buffer = buffer
        self.stats = stats
        self.region = region
        self._views = descriptors.tensor_views(buffer, manifest)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def __repr__(self) -> str:
        return f"PulledWeights(version={self.version}, tensors={len(self)}, bytes={self.manifest.total_bytes})"


class PartialPulls:
    """Pulls that ended part way, by version: their buffer and the chunks they hold, which a
    later pull of the same version (with no buffer given, or into the same one) resumes
    from instead of fetching those chunks again."""

    def __init__(self) -> None:
        self._by_version: dict[int, tuple[torch.Tensor, object | None, bytes, bytes]] = {}
        self._lock = threading.Lock()

    def remember(self, handle: PullHandle, held: bytes) -> None:
        with self._lock:
            self._by_version[handle.version] = (handle.buffer, handle.region, held, handle.manifest.chunk_tags)

    def forget(self, version: int) -> None:
        with self._lock:
            self._by_version.pop(version, None)

    def find(self, manifest: Manifest) -> tuple[torch.Tensor, object | None, bytes] | None:
        """(buffer, region, held-chunk bitmap) of a failed pull of exactly this version."""
        with self._lock:
            entry = self._by_version.get(manifest.version)
        if entry is None or entry[3] != manifest.chunk_tags:
            return None
        return entry[:3]

    def clear(self) -> None:
        with self._lock:
            self._by_version.clear()


class PullHandle:
    """One pull in progress: ``start()`` returns at once, ``wait(timeout)`` collects it."""

    def __init__(self, native_puller, plan, manifest: Manifest, buffer: torch.Tensor, region: object | None,
                 seed: bytes, progress: ProgressCallback | bool | None, *, relay: Relay | None = None,
                 partial: PartialPulls | None = None):
        """relay: serves the buffer to peers while it fills; partial: remembers what a
        failed pull holds (None: a pull not to resume, such as a delta's payload)."""
        self.manifest = manifest
        self.version = manifest.version
        self.buffer = buffer
        self.region = region
        self._relay, self._partial = relay, partial
        self._native = native_puller
        self._plan = plan
        self.native_manifest = plan.manifest  # what relaying this version serves
        # "host:port: reason" for each source left out when the version was resolved.
        self.skipped_sources: list[str] = list(plan.skipped)
        self._seed = seed
        # progress=True: a tqdm bar, for runs a person is watching.
        self._progress = TqdmProgress(desc=f"pull weights v{self.version}") if progress is True else progress
        self._job = None
        self._result: PulledWeights | None = None

    @property
    def total_bytes(self) -> int:
        return self.manifest.total_bytes

    @property
    def bytes_done(self) -> int:
        return self._job.bytes_done if self._job is not None else 0

    @property
    def started(self) -> bool:
        return self._job is not None

    def start(self) -> "PullHandle":
        """Starts moving bytes in native threads and returns immediately."""
        if self._job is not None:
            raise ValueError("pull already started")
        store, registration = None, 0
        if self._relay is not None:
            store, registration = self._relay.store, self._relay.serve(self.native_manifest, self.buffer, self.region)
        addr, nbytes = descriptors.describe(self.buffer)
        try:
            self._job = self._native.start(self._plan, addr, nbytes, store, registration, self._seed,
                                           keepalive=(self.buffer, self.region))
        except BaseException:
            if self._relay is not None:
                self._relay.retire(self.version)
            raise
        self._plan = None
        return self

    @property
    def done(self) -> bool:
        """True once the pull has ended, succeeded or failed: wait() then returns or raises
        at once."""
        return self._result is not None or (self._job is not None and bool(self._job.wait(0)))

    def poll(self, timeout: float = 0.0) -> bool:
        """Waits up to `timeout` seconds for the pull to end; True once it has (succeeded or
        failed), False while bytes still move. It never raises for a slice that ran out, so
        callers tell "not done yet" apart from a pull that failed with TransferTimeout."""
        if self._result is not None:
            return True
        if self._job is None:
            self.start()
        return self._wait_slices(time.monotonic() + timeout)

    def wait(self, timeout: float | None = None) -> PulledWeights:
        """Blocks until the pull is done (or `timeout` seconds pass: TransferTimeout, the pull
        keeps running; check `done` to tell it from a failed pull). Raises the pull's typed
        error, at once, if it failed."""
        if self._result is not None:
            return self._result
        if self._job is None:
            self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._wait_slices(deadline):
            raise TransferTimeout(f"pull of version {self.version} not done after {timeout} s "
                                  f"({self.bytes_done} of {self.total_bytes} bytes)")
        try:
            self._job.raise_if_failed()
        except TransferError:
            if self._partial is not None:
                self._partial.remember(self, self._job.held_bitmap())
            raise
        if self._partial is not None:
            self._partial.forget(self.version)
        self._result = PulledWeights(self.manifest, self.buffer, self.region, self.stats())
        return self._result

    def _wait_slices(self, deadline: float | None) -> bool:
        """Native waits until the job ends (True) or the deadline passes (False)."""
        # Short native waits keep progress callbacks flowing and Ctrl-C responsive.
        step = 0.1 if self._progress is not None else 0.25
        while True:
            left = step if deadline is None else max(0.0, min(step, deadline - time.monotonic()))
            finished = self._job.wait(left)
            if self._progress is not None:
                self._progress(self.bytes_done, self.total_bytes)
            if finished:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def cancel(self) -> None:
        """Stops the pull; a later wait() raises TransferClosed."""
        if self._job is not None:
            self._job.cancel()

    def stats(self) -> dict:
        """chunk_requests, chunks_fetched, refetched, per source bytes/chunks/
        integrity_failures/errors, skipped_sources (left out when the version was
        resolved), bytes (fetched in all) and route ("full": no delta was used)."""
        out = self._job.stats() if self._job is not None else {}
        out["skipped_sources"] = list(self.skipped_sources)
        out["route"], out["fallback"] = "full", None
        out["bytes"] = sum(s["bytes"] for s in out.get("sources", []))
        return out

    def __enter__(self) -> "PullHandle":
        return self

    def __exit__(self, *exc) -> None:
        if self._result is None:
            self.cancel()
