"""Deterministic tokens of the emulated engine: token t of a sample is a hash of (weights,
prompt, seed, sample_id, t), and its KV pages are stand-ins an importer can check. Kept
apart from the engine's timing model so each stays readable.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import numpy as np

from rlboost.errors import RolloutError
from rlboost.migration.layout import KVLayout
from rlboost.migration.state import RequestState

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# Emulated KV pages: per cached position, its token id and its position as two int32 values
# (8 bytes = 1 layer x (K, V) x 1 head x 1 dim x float32), so an importer can check them.
KV_LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, block_size=16, dtype="float32")


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finalizer; uint64 array arithmetic wraps modulo 2**64 as intended
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _digest(*parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return int.from_bytes(h.digest(), "little")


def sample_key(weights: int, state: RequestState) -> int:
    """What a sample's tokens depend on: weights and prompt, plus seed and id unless greedy."""
    prompt = np.asarray(state.prompt_ids, dtype=np.int64).tobytes()
    if state.params.temperature == 0.0:
        return _digest(weights.to_bytes(8, "little"), prompt)
    return _digest(weights.to_bytes(8, "little"), prompt, (state.seed & _MASK).to_bytes(8, "little"),
                   state.sample_id.to_bytes(8, "little"))


def emulated_tokens(key: int, start: int, stop: int, *, vocab_size: int, eos_token_id: int,
                    eos_probability: float) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens start..stop-1 of the sample with this key, and their logprobs (float32).

    >>> ids, lp = emulated_tokens(7, 0, 4, vocab_size=100, eos_token_id=2, eos_probability=1.0)
    >>> ids.tolist(), bool((lp <= 0).all())
    ([2, 2, 2, 2], True)
    """
    t = np.arange(start, stop, dtype=np.uint64)
    h = _mix(t * np.uint64(_GOLDEN) + np.uint64(key))
    eos = (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < eos_probability
    h2 = _mix(h ^ np.uint64(0xD6E8FEB86659FD93))
    ids = (h2 % np.uint64(vocab_size)).astype(np.int64)
    ids[eos] = eos_token_id
    logprobs = (-(h2 >> np.uint64(40)).astype(np.float64) * (8.0 / 2 ** 24)).astype(np.float32)
    return ids, logprobs


def weights_fingerprint(named_tensors: Mapping[str, Any]) -> tuple[int, dict[str, tuple]]:
    """A hash standing for the weights' values, and their schema (name -> shape, dtype).

    Only the first and last 64 KiB of each tensor enter the hash: enough to tell versions
    apart in emulation without reading gigabytes.
    """
    parts, schema = [], {}
    for name in sorted(named_tensors):
        value = named_tensors[name]
        if hasattr(value, "detach"):  # a torch tensor
            import torch

            value = value.detach().cpu().contiguous()
            schema[name] = (tuple(value.shape), str(value.dtype))
            raw = value.reshape(-1).view(torch.uint8).numpy()
        else:
            arr = np.ascontiguousarray(np.asarray(value))
            schema[name] = (tuple(arr.shape), str(arr.dtype))
            raw = arr.reshape(-1).view(np.uint8)
        parts += [name.encode(), repr(schema[name]).encode(), raw[:65536].tobytes(), raw[-65536:].tobytes()]
    return _digest(*parts), schema


def kv_pages(state: RequestState):
    """Emulated pages of every position but the last (which has not been fed yet)."""
    import torch

    seq = np.asarray(state.prompt_ids + state.output_ids, dtype=np.int32)[:-1]
    pages = np.stack([seq, np.arange(len(seq), dtype=np.int32)], axis=1)
    return len(seq), torch.from_numpy(pages.reshape(-1).view(np.uint8).copy())


def check_kv_pages(state: RequestState, tokens: int, data) -> None:
    seq = np.asarray(state.prompt_ids + state.output_ids, dtype=np.int32)[:tokens]
    pages = data.cpu().numpy().view(np.int32).reshape(-1, 2)
    if not (np.array_equal(pages[:, 0], seq) and np.array_equal(pages[:, 1], np.arange(tokens))):
        raise RolloutError(f"KV pages of sample {state.sample_id} do not match its tokens")
