"""What a reward worker process runs for one call: load the user's function (once per
process), call it on one sample or one batch, and turn each return value or exception into
a RewardResult there, so nothing the function returns needs to cross back as it is."""

from __future__ import annotations

import asyncio
import inspect
import pickle
from typing import Any, Sequence

from rlboost.tasks.reward.plugin import RewardTarget, load_function
from rlboost.tasks.reward.records import NOT_A_NUMBER, NotANumber, RewardResult, read_value

Item = tuple[str, str, dict, dict]  # prompt, completion, row, metadata


def call_reward(target: RewardTarget, payloads: Sequence[bytes]) -> list[RewardResult]:
    """One result per item, each pickled by the driver (a batched call that fails fails for
    every item of the batch)."""
    items: list[Item] = [pickle.loads(p) for p in payloads]
    fn = load_function(target)
    try:
        if target.batched:
            prompts, completions, rows, metas = (list(column) for column in zip(*items))
            values = _run(fn(prompts=prompts, completions=completions, rows=rows, metadata=metas))
            if not isinstance(values, (list, tuple)) or len(values) != len(items):
                got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
                return [RewardResult.failing(NOT_A_NUMBER, f"a batched reward returned {got} results "
                                                           f"for {len(items)} samples")] * len(items)
        else:
            (prompt, completion, row, meta), = items
            values = [_run(fn(prompt=prompt, completion=completion, row=row, metadata=meta))]
    except Exception as e:  # the user's code raised: this call's samples score 0
        return [RewardResult.failing(type(e).__name__, str(e) or repr(e))] * len(items)
    return [_result(v) for v in values]


def _run(value: Any) -> Any:
    return asyncio.run(_await(value)) if inspect.isawaitable(value) else value


async def _await(value: Any) -> Any:
    return await value


def _result(value: Any) -> RewardResult:
    try:
        return read_value(value)
    except NotANumber as e:
        return RewardResult.failing(NOT_A_NUMBER, str(e))
