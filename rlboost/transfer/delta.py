"""Delta updates: version k+1 served as a lossless bit-pattern delta against version k.

The publisher encodes each delta once, on a thread of its own after the full version is
served (DeltaEncoder), into the same store under ``delta_key(k+1)``, so it is chunked,
tagged, pulled and relayed like any version. A puller that holds k applies it
(apply_deltas) and accepts the result only when every chunk matches version k+1's own
tags (mismatched_chunks); on any doubt it pulls the full version instead.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque

import torch

from rlboost import _C
from rlboost.errors import TransferError
from rlboost.transfer import descriptors
from rlboost.transfer.config import TransferConfig
from rlboost.transfer.manifest import DTYPE_SIZES, Manifest

DELTA_KEY_BIT: int = _C.DELTA["key_bit"]
SAMPLED_VALUES = 1 << 16  # enough for the share of changed values to +-0.4% (95%)
log = logging.getLogger(__name__)


def delta_key(target: int) -> int:
    """The key delta(target - 1 -> target) is served under (beside the full versions)."""
    return target | DELTA_KEY_BIT


def is_delta_key(key: int) -> bool:
    return key >= 0 and bool(key & DELTA_KEY_BIT)


def tags_digest(tags: bytes) -> str:
    """Hex SHA-256 of a version's chunk tags: what a delta names its base and target by."""
    return hashlib.sha256(tags).hexdigest()


def apply_deltas(deltas: list[torch.Tensor], base: torch.Tensor, dst: torch.Tensor, threads: int) -> None:
    """dst = base with each delta (uint8 buffers, oldest first) applied in turn; dst may be
    base's memory (then only changed bytes are written). ProtocolError for a malformed
    delta, ValueError for one of another payload size; dst is then partly written."""
    base_addr, nbytes = descriptors.describe(base)
    dst_addr, dst_bytes = descriptors.describe(dst)
    if dst_bytes != nbytes:
        raise ValueError(f"dst: holds {dst_bytes} bytes, the base {nbytes}")
    src = base_addr
    for delta in deltas:
        addr, size = descriptors.describe(delta)
        _C.delta_apply(delta=addr, delta_bytes=size, base=src, dst=dst_addr, nbytes=nbytes, threads=threads)
        src = dst_addr


def mismatched_chunks(native_manifest, buffer: torch.Tensor, secret: bytes, threads: int) -> list[int]:
    """Chunks of `buffer` that do not match the version's tags (empty: exactly its bytes)."""
    addr, nbytes = descriptors.describe(buffer)
    return native_manifest.mismatched_chunks(address=addr, nbytes=nbytes, secret=secret, threads=threads)


def sample_values(buffer: torch.Tensor, manifest: Manifest, count: int = SAMPLED_VALUES) -> list[torch.Tensor]:
    """Copies of about `count` values spread evenly over the payload's tensors (in proportion
    to their bytes), one row of bytes per value, per value size. Two versions' samples tell
    the share of values that changed (changed_share) without a pass over the payload: what
    says why a delta was declined."""
    total = sum(s.nbytes for s in manifest.tensors) or 1
    starts: dict[int, list[torch.Tensor]] = {}
    for spec in manifest.tensors:
        size = DTYPE_SIZES[spec.dtype]
        n = spec.nbytes // size
        if n:
            k = max(1, min(n, round(count * spec.nbytes / total)))
            starts.setdefault(size, []).append(spec.offset + torch.linspace(0, n - 1, k, dtype=torch.float64).long().clamp_(max=n - 1) * size)
    return [buffer[torch.cat(parts)[:, None] + torch.arange(size)].clone() for size, parts in sorted(starts.items())]


def changed_share(before: list[torch.Tensor], after: list[torch.Tensor]) -> float | None:
    """The share of sampled values whose bits differ (None: the samples are of other layouts)."""
    if len(before) != len(after) or any(a.shape != b.shape for a, b in zip(before, after)):
        return None
    values = sum(a.shape[0] for a in after)
    changed = sum(int((a != b).any(dim=1).sum()) for a, b in zip(before, after))
    return changed / values if values else None


class DeltaEncoder:
    """The publisher's delta thread: encodes delta(base -> target) of versions its store
    holds, one at a time, newest first (a delta still waiting when a newer one is asked
    for would serve nobody, so it is dropped). Encoding happens in native threads without
    the GIL, while the trainer goes on with its next step."""

    def __init__(self, store, config: TransferConfig):
        self._store, self._config = store, config
        self._cond = threading.Condition()
        self._pending: tuple[int, int] | None = None
        self._busy = False
        self._closed = False
        self._done: deque[dict] = deque(maxlen=64)
        self._thread = threading.Thread(target=self._run, name="delta-encoder", daemon=True)
        self._thread.start()

    def submit(self, base: int, target: int) -> None:
        """Encode delta(base -> target) soon; replaces a request not yet started."""
        with self._cond:
            if self._pending is not None:
                self._done.append({"base": self._pending[0], "target": self._pending[1],
                                   "error": "dropped: a newer delta was asked for first"})
            self._pending = (base, target)
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Waits until no delta is waiting or being encoded; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def stats(self) -> list[dict]:
        """The latest deltas, oldest first: base, target, declined (larger than
        delta_max_fraction: not served), bytes, target_bytes, encode_s, total_s (with
        tagging and staging); or base, target and error."""
        with self._cond:
            return list(self._done)

    def close(self, timeout: float = 60.0) -> None:
        """Drops what waits, lets an encoding in progress finish and stops the thread."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._pending is not None)
                if self._closed:
                    return
                (base, target), self._pending = self._pending, None
                self._busy = True
            record = self._encode(base, target)
            with self._cond:
                self._done.append(record)
                self._busy = False
                self._cond.notify_all()

    def _encode(self, base: int, target: int) -> dict:
        c = self._config
        t0 = time.perf_counter()
        try:
            out = self._store.commit_delta(base=base, target=target, chunk_bytes=c.delta_chunk_bytes,
                                           max_fraction=c.delta_max_fraction, threads=c.delta_threads)
        except (TransferError, ValueError) as exc:  # e.g. the base was retired meanwhile: pullers take the full one
            log.warning("delta %d -> %d not published: %s", base, target, exc)
            return {"base": base, "target": target, "error": str(exc)}
        return {"base": base, "target": target, "declined": out["declined"], "bytes": out["manifest"].total_bytes,
                "target_bytes": out["target_bytes"], "encode_s": out["encode_s"], "total_s": out["total_s"],
                "wall_s": time.perf_counter() - t0}
