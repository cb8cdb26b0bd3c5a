"""The token model behind FakeSGLangEngineForTests (test-only): tokens are a deterministic
function of (weights, every token before them), sampled as SGLang samples.

Logits come from a hash of the weights and the prefix; sampling applies temperature, top-k
and top-p as SGLang does and, with enable_deterministic_inference and a sampling_seed, draws
with Gumbel noise keyed by (seed, position) as SGLang's multinomial_with_seed does
(otherwise at random). Greedy (temperature < 1e-6) reports log-probs at temperature 1.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

_MASK = (1 << 64) - 1


def mix(h: int, token: int) -> int:
    """The running hash of a token prefix."""
    return ((h ^ (token + 0x9E3779B97F4A7C15)) * 0x100000001B3) & _MASK


def prefix_hash(tokens) -> int:
    h = 0
    for t in tokens:
        h = mix(h, t)
    return h


def digest(t: torch.Tensor) -> bytes:
    return hashlib.blake2b(t.detach().to(torch.float32).contiguous().numpy().tobytes(), digest_size=16).digest()


def weights_key(digests: dict[str, bytes]) -> int:
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(digests):
        h.update(name.encode() + digests[name])
    return int.from_bytes(h.digest(), "little")


def sample(key: int, prefix: int, position: int, vocab_size: int, params: dict, seeded: bool,
           rng: np.random.Generator) -> tuple[int, float]:
    """(token, logprob) at `position` after the prefix hashed to `prefix`."""
    logits = np.random.default_rng([key, prefix]).standard_normal(vocab_size) * 2.0
    temperature = params.get("temperature", 1.0)
    if temperature < 1e-6:
        probs = _softmax(logits)
        token = int(np.argmax(logits))
        return token, float(np.log(probs[token]))
    probs = _softmax(logits / temperature)
    kept = _top_k_top_p(probs, params.get("top_k", -1), params.get("top_p", 1.0))
    seed = params.get("sampling_seed")
    if seeded and seed is not None:
        gumbel = np.random.default_rng([seed, position]).gumbel(size=vocab_size)
        with np.errstate(divide="ignore"):
            token = int(np.argmax(np.log(kept) + gumbel))
    else:
        token = int(rng.choice(vocab_size, p=kept / kept.sum()))
    return token, float(np.log(probs[token]))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _top_k_top_p(probs: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    order = np.argsort(-probs, kind="stable")
    keep = np.ones(len(probs), dtype=bool)
    if 0 < top_k < len(probs):
        keep[order[top_k:]] = False
    sorted_p = probs[order]
    keep[order[(np.cumsum(sorted_p) - sorted_p) > top_p]] = False
    return np.where(keep, probs, 0.0)
