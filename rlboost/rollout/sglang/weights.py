"""How a weight set (checked against the checkpoint: rlboost.rollout.server.checkpoint_facts) is cut
into buckets before SGLang sees any of it, and the calls that hand the buckets to SGLang as
each release line wants them.

SGLang's update_weights_from_tensor pickles tensors for its scheduler process; pickling a CPU
tensor moves its whole storage into shared memory in place (a new address). Handing it a view
of a weight-transfer staging buffer would move the buffer under the native code that
registered it, so every CPU tensor goes over as a copy the adapter owns, one bucket at a time.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator

import torch

from rlboost.errors import RolloutError
from rlboost.models.buckets import buckets, decoder_layer
from rlboost.models.checkpoint import TORCH_DTYPES

__all__ = ["flush_when_idle", "push_weights", "weight_buckets"]


def weight_buckets(pairs: list[tuple[str, torch.Tensor]], bucket_bytes: int,
                   dtype: str = "auto") -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive buckets of about bucket_bytes, whole decoder layers each (a larger layer
    goes alone: rlboost.models.buckets), each tensor cast to `dtype` unless "auto". CPU
    tensors become fresh contiguous copies, one bucket at a time; GPU tensors go by CUDA IPC,
    which leaves their memory where it is, so they are only made contiguous."""
    target = TORCH_DTYPES.get(dtype)
    for bucket in buckets(pairs, bucket_bytes=bucket_bytes, unit=lambda pair: decoder_layer(pair[0]),
                          nbytes=lambda pair: pair[1].numel() * (target or pair[1].dtype).itemsize):
        yield [(name, _owned(t, target)) for name, t in bucket]


def _owned(t: torch.Tensor, target: torch.dtype | None) -> torch.Tensor:
    t = t.detach()
    want = target or t.dtype
    if t.device.type == "cpu":
        return t.to(dtype=want, copy=True, memory_format=torch.contiguous_format)
    return t.to(dtype=want).contiguous()


Bucket = list[tuple[str, torch.Tensor]]


def has_update_session(engine: Any) -> bool:
    """Whether this SGLang wants weight updates inside a session: from 0.5.21 on, Engine's
    update_weights_from_tensor is refused unless it runs between begin_weight_update() and
    end_weight_update(); earlier releases have neither call."""
    return callable(getattr(engine, "begin_weight_update", None))


def push_weights(engine: Any, buckets: Iterable[Bucket]) -> None:
    """Hand SGLang every bucket (without its own cache flush: see flush_when_idle), inside a
    weight-update session where the release has one. The session is closed whatever happens,
    so a failed load does not leave SGLang refusing the next one."""
    session = has_update_session(engine)
    if session:
        check_result(engine.begin_weight_update(), "begin_weight_update")
    try:
        for bucket in buckets:
            check_result(engine.update_weights_from_tensor(bucket, load_format=None, flush_cache=False),
                         "update_weights_from_tensor")
    except BaseException:
        if session:
            try:
                engine.end_weight_update()
            except Exception:  # the first error is the one to report
                pass
        raise
    if session:
        check_result(engine.end_weight_update(), "end_weight_update")


def flush_when_idle(engine: Any, sleep: Callable[[float], None], timeout_s: float) -> int:
    """Call Engine.flush_cache until SGLang accepts it and return the number of calls. SGLang
    refuses a flush while any request is running (from 0.5.20 on, also while one is queued),
    which includes requests whose abort its scheduler has not processed yet; `sleep` must
    let SGLang's event loop run meanwhile. RolloutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    delay, calls = 0.005, 0
    while True:
        calls += 1
        ok, message = read_result(engine.flush_cache())
        if ok:
            return calls
        if time.monotonic() >= deadline:
            raise RolloutError(f"SGLang refused flush_cache for {timeout_s:g} s (flush_timeout_s), "
                               f"{calls} calls: {message or 'requests still queued or running'}")
        sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        delay = min(2 * delay, 0.25)


def read_result(result: Any) -> tuple[bool, str]:
    """SGLang answers (success, message), an object with .success (and .message), or None."""
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], bool):
        return result[0], str(result[1]) if len(result) > 1 else ""
    if hasattr(result, "success"):
        return bool(result.success), getattr(result, "message", "") or getattr(result, "error_msg", "") or ""
    return True, ""


def check_result(result: Any, what: str) -> None:
    ok, message = read_result(result)
    if not ok:
        raise RolloutError(f"SGLang {what} failed: {message}")
