"""Synthetic prompt groups for simulated runs: deterministic in (seed, step), so two
policies (or two runs) see the same work.
"""

from __future__ import annotations

from rlboost.controller.records import PromptGroup
from rlboost.migration.state import SamplingParams


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
