"""Response lengths of emulated samples: the long tail of reasoning traces, as a log-normal
whose log-mean varies per prompt (hard prompts make every sample of their group long).

Lengths depend only on the sample's prompt, seed and id, never on the engine that runs it,
so a migrated sample ends where it would have, and the simulator draws the same lengths.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist

LENGTH_KINDS = ("geometric", "lognormal")
_NORMAL = NormalDist()


@dataclass(kw_only=True, slots=True)
class LengthConfig:
    """How long emulated responses are.

    "geometric": every token ends its sample with the engine's stop_probability (short,
    memoryless: no tail). "lognormal": a response has exp(ln median_tokens + prompt_sigma z_p
    + sample_sigma z_s) real tokens, capped at max_new_tokens, with z_p drawn per prompt
    and z_s per sample. Log-normal is the usual parametric form of LLM output lengths;
    reasoning traces make it heavy: the defaults (median 3,000 tokens, total log-sd 0.9)
    give a mean near 4,200 tokens and about 4% of samples at a 14,336-token cap, so a
    step's last samples run several times longer than its median (the long tail that
    APRIL, arXiv 2509.18521, and Seer, arXiv 2511.14617, measure in RL rollouts: Seer
    reports the last 10% of requests taking up to half of the rollout time).

    >>> round(LengthConfig(kind="lognormal").mean_tokens(cap=14336))
    4186
    """

    kind: str = "geometric"
    """geometric (stop_probability per token) or lognormal (the long tail of reasoning traces)"""
    median_tokens: float = 3000.0
    """lognormal: median response length, real tokens"""
    prompt_sigma: float = 0.5
    """lognormal: log-sd shared by a prompt's samples (hard prompts are long for all)"""
    sample_sigma: float = 0.75
    """lognormal: log-sd of each sample around its prompt's"""

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"kind must be one of {LENGTH_KINDS}, got {self.kind!r}")
        if not self.median_tokens >= 1:
            raise ValueError(f"median_tokens must be >= 1, got {self.median_tokens}")
        for name in ("prompt_sigma", "sample_sigma"):
            if not 0 <= getattr(self, name) <= 5:
                raise ValueError(f"{name} must be in [0, 5], got {getattr(self, name)}")

    @property
    def sigma(self) -> float:
        return math.hypot(self.prompt_sigma, self.sample_sigma)

    def mean_tokens(self, cap: float) -> float:
        """Expected real length with the cap applied (closed form of a capped log-normal)."""
        mu, s = math.log(self.median_tokens), self.sigma
        if s == 0:
            return min(cap, self.median_tokens)
        z = (math.log(cap) - mu) / s
        below = math.exp(mu + s * s / 2) * _NORMAL.cdf(z - s)
        return below + cap * (1.0 - _NORMAL.cdf(z))


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    # splitmix64's finalizer: cheap, and every input bit moves every output bit
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def _uniform(*parts: int) -> float:
    """A uniform draw in (0, 1) that depends only on the parts."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = _mix((h ^ (int(p) & _MASK)) * 0x9E3779B97F4A7C15 & _MASK)
    return (h + 0.5) / 2.0 ** 64


def prompt_key(prompt_ids, seed: int) -> int:
    """A key for the prompt group a sample belongs to (its prompt and the group's seed)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(int(seed).to_bytes(16, "little", signed=True))
    h.update(b"".join(int(t).to_bytes(4, "little") for t in prompt_ids))
    return int.from_bytes(h.digest(), "little")


def response_length(config: LengthConfig, group: int, sample_id: int, max_new_tokens: int,
                    token_block: int = 1) -> int:
    """Length in emulated tokens (each standing for token_block real ones), in [1, max_new_tokens],
    of a lognormal sample; group is prompt_key() of its prompt and seed.

    >>> cfg = LengthConfig(kind="lognormal")
    >>> response_length(cfg, 7, 3, 448, 32) == response_length(cfg, 7, 3, 448, 32)
    True
    """
    return response_lengths(config, group, (sample_id,), max_new_tokens, token_block)[0]


def response_lengths(config: LengthConfig, group: int, sample_ids, max_new_tokens: int,
                     token_block: int = 1) -> tuple[int, ...]:
    """response_length of each of a group's samples (the prompt's draw is made once)."""
    log_prompt = math.log(config.median_tokens) + config.prompt_sigma * _NORMAL.inv_cdf(_uniform(group, 1))
    out = []
    for sid in sample_ids:
        real = math.exp(log_prompt + config.sample_sigma * _NORMAL.inv_cdf(_uniform(group, sid, 2)))
        out.append(max(1, min(max_new_tokens, math.ceil(real / token_block))))
    return tuple(out)
