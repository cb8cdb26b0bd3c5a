"""Synthetic prompt groups for simulated runs: deterministic in (seed, step), so two
policies (or two runs) see the same work.
"""

from __future__ import annotations

import math
import random

from rlboost.controller.records import GROUP_STRIDE, PromptGroup
from rlboost.migration.state import SamplingParams
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.rollout.emulated.lengths import prompt_key, response_lengths
from rlboost.sim.collector import SimGroup


def make_groups(step: int, *, num_groups: int, group_size: int, prompt_len: int, max_new_tokens: int,
                seed: int = 0, stop_token_ids: tuple[int, ...] = (2,)) -> list[PromptGroup]:
    """Prompt groups for one step, deterministic in (seed, step); samples stop at token 2
    (the emulated engines' default end-of-sequence id) unless told otherwise.

    >>> [g.group_id for g in make_groups(2, num_groups=2, group_size=4, prompt_len=3, max_new_tokens=8)]
    [200000, 200001]
    """
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids)
    return [PromptGroup(group_id=step * 100_000 + g, prompt_ids=tuple(range(1, prompt_len + 1)),
                        params=params, num_samples=group_size, seed=seed * 1_000_003 + step)
            for g in range(num_groups)]


def sim_groups(step: int, *, num_groups: int, group_size: int, prompt_len: int, max_new_tokens: int,
               engine: EmulatedEngineConfig, seed: int = 0) -> list[SimGroup]:
    """A simulated step's groups, each with its own seed (as a task feed gives them), and
    every sample's final length drawn as an emulated engine would draw it: from
    engine.lengths (lognormal: by prompt, seed and sample id), or one stop_probability
    chance per token (geometric).

    >>> [len(g.lengths) for g in sim_groups(1, num_groups=2, group_size=4, prompt_len=3, max_new_tokens=8,
    ...                                      engine=EmulatedEngineConfig())]
    [4, 4]
    """
    out = []
    prompt = tuple(range(1, prompt_len + 1))
    for g in range(num_groups):
        gid = step * 100_000 + g
        group_seed = (seed * 1_000_003 + step * 7_919 + (g + 1) * 104_729 + 1) % (1 << 63)
        key = prompt_key(prompt, group_seed)
        sids = tuple(gid * GROUP_STRIDE + j for j in range(group_size))
        if engine.lengths.kind == "lognormal":
            lengths = response_lengths(engine.lengths, key, sids, max_new_tokens, engine.token_block)
        else:
            lengths = tuple(_geometric(key, sid, engine.stop_probability, max_new_tokens) for sid in sids)
        out.append(SimGroup(group_id=gid, sample_ids=sids, prompt_len=prompt_len, lengths=lengths,
                            max_new=max_new_tokens))
    return out


def _geometric(key: int, sid: int, p: float, cap: int) -> int:
    if p <= 0:
        return cap
    if p >= 1:
        return 1
    u = random.Random(key * 31 + sid).random()
    return max(1, min(cap, int(math.log(1.0 - u) / math.log(1.0 - p)) + 1))


def as_sim_groups(groups, engine: EmulatedEngineConfig) -> list[SimGroup]:
    """A task feed's PromptGroups with the lengths an emulated engine draws for their samples,
    so a simulation rolls out exactly the work an emulated run of the same config does."""
    out = []
    for g in groups:
        key = prompt_key(g.prompt_ids, g.seed)
        if engine.lengths.kind == "lognormal":
            lengths = response_lengths(engine.lengths, key, g.sample_ids, g.params.max_new_tokens, engine.token_block)
        else:
            lengths = tuple(_geometric(key, sid, engine.stop_probability, g.params.max_new_tokens)
                            for sid in g.sample_ids)
        out.append(SimGroup(group_id=g.group_id, sample_ids=g.sample_ids, prompt_len=len(g.prompt_ids),
                            lengths=lengths, max_new=g.params.max_new_tokens))
    return out
