"""Weights into vLLM: each bucket of (name, tensor) pairs is written once into a shared-memory
file, whose layout goes to every vLLM worker by `collective_rpc`; the rlboost worker extension
(worker.py) maps the file and reloads the model from it in place. After the last bucket the
prefix cache (KV computed with the old weights) is dropped once vLLM lets it.

One copy on the way: from the pulled buffers into the shared file (vLLM's workers are other
processes, and TP ranks all read the same file); no tensor is pickled.
TODO(perf): pulled buffers that already live in shared memory, or CUDA IPC for GPU pulls,
would save that copy.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from rlboost.errors import RolloutError
from rlboost.models.checkpoint import TORCH_DTYPES

LOAD_CALL = "rlboost_load_weights"  # the worker extension's method
_ALIGN = 64


@dataclass(frozen=True, slots=True)
class SharedBucket:
    """A bucket as its workers read it: the file and, per tensor, (name, dtype, shape, offset).

    >>> SharedBucket(path="/dev/shm/rlboost-w-1", entries=(("lm_head.weight", "bfloat16", (320, 64), 0),)).names
    ('lm_head.weight',)
    """

    path: str
    entries: tuple[tuple[str, str, tuple[int, ...], int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e[0] for e in self.entries)


def shared_dir() -> Path:
    """Where buckets are written: /dev/shm (memory) when there is one, else the temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@contextmanager
def shared_bucket(pairs: list[tuple[str, torch.Tensor]], dtype: str = "auto") -> Iterator[SharedBucket]:
    """Write the pairs (cast to dtype unless "auto") into a fresh shared file; removed on exit."""
    target = TORCH_DTYPES.get(dtype)
    layout, size = [], 0
    for name, t in pairs:
        want = target or t.dtype
        layout.append((name, want, tuple(t.shape), size))
        size += -(-t.numel() * torch.empty((), dtype=want).element_size() // _ALIGN) * _ALIGN
    path = shared_dir() / f"rlboost-vllm-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, max(size, 1))
        with mmap.mmap(fd, max(size, 1)) as mm:
            flat = torch.frombuffer(mm, dtype=torch.uint8)
            for (_, t), (_, want, shape, offset) in zip(pairs, layout):
                n = t.numel()
                dest = flat[offset:offset + n * torch.empty((), dtype=want).element_size()].view(want).view(shape)
                dest.copy_(t.detach())
            del flat, dest
        os.close(fd)
        fd = -1
        yield SharedBucket(path=str(path), entries=tuple((n, str(d).removeprefix("torch."), s, o)
                                                         for n, d, s, o in layout))
    finally:
        if fd >= 0:
            os.close(fd)
        path.unlink(missing_ok=True)


def check_loaded(answers: Any, bucket: SharedBucket, tp_size: int) -> None:
    """collective_rpc answers one count per worker: every worker must have taken every tensor."""
    counts = list(answers) if isinstance(answers, (list, tuple)) else [answers]
    if len(counts) != tp_size or any(c != len(bucket.entries) for c in counts):
        raise RolloutError(f"vLLM workers loaded {counts} of {len(bucket.entries)} tensors (one count "
                           f"per worker expected, {tp_size} workers)")


def reset_when_idle(reset: Callable[[], bool], sleep: Callable[[float], None], timeout_s: float) -> int:
    """Call reset() (vLLM's reset_prefix_cache) until it succeeds; vLLM refuses while any
    request holds KV blocks, which includes requests whose abort its engine core has not
    processed yet. `sleep` must let vLLM's event loop run meanwhile. RolloutError after
    timeout_s. Returns the number of calls."""
    deadline = time.monotonic() + timeout_s
    delay, calls = 0.005, 0
    while True:
        calls += 1
        if reset():
            return calls
        if time.monotonic() >= deadline:
            raise RolloutError(f"vLLM refused reset_prefix_cache for {timeout_s:g} s (flush_timeout_s), "
                               f"{calls} calls: requests still hold KV blocks")
        sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        delay = min(2 * delay, 0.25)
