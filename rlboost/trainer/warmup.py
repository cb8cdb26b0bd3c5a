"""What a tiny model's supervised warm-up trains on: (prompt, answer) pairs drawn from the
run's own task, so any task whose problems carry reference answers (generated sums, a math
file, a data set's answer column) starts GRPO from a model that sometimes answers right,
and groups differ from step 1. The cache key names the pairs themselves, so a changed file
warms up again."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from typing import Callable

from rlboost.tasks.arithmetic import ArithmeticTask
from rlboost.tasks.config import TaskConfig

Pairs = Callable[..., list[tuple[str, str]]]  # pairs(n, seed=...) -> n (prompt, answer) pairs


def warmup_key(task: TaskConfig) -> dict:
    """What identifies the warm-up's pairs, for the starting checkpoint's cache key (cheap
    for generated sums; a data set is read to name its pairs)."""
    if task.name == "arithmetic":
        return {"task": "arithmetic", **{k: getattr(task.arithmetic, k) for k in task.arithmetic.__slots__}}
    pairs = _task_pairs(task)
    digest = hashlib.sha256(json.dumps(pairs).encode()).hexdigest() if pairs else ""
    return {"task": task.name, "pairs": digest}


def warmup_pairs(task: TaskConfig) -> Pairs:
    """pairs(n, seed=s): n (prompt, answer) pairs of the task, seeded; ValueError (one line)
    when the task has no reference answer to warm up on."""
    if task.name == "arithmetic":
        return ArithmeticTask(task.arithmetic).warmup_pairs
    pairs = _task_pairs(task)
    if not pairs:
        raise ValueError("model.warmup_steps > 0 warms the tiny model up on the task's reference answers, and "
                         "this task has none (task.dataset.answer_key): set model.warmup_steps=0")

    def draw(n: int, *, seed: int) -> list[tuple[str, str]]:
        rng = random.Random(seed)
        return [rng.choice(pairs) for _ in range(n)]
    return draw


def _task_pairs(task: TaskConfig) -> list[tuple[str, str]]:
    """Every problem with an answer the run could generate (within task.max_new_tokens of
    the tiny model's bytes), its prompt wrapped as the run's feed wraps it."""
    from rlboost.tasks.factory import build_task

    quiet = logging.getLogger("rlboost.dataset")  # the run's own reading of the file says what it refuses
    level, quiet.level = quiet.level, logging.ERROR
    try:
        source = build_task(task)
    finally:
        quiet.level = level
    problems = source.problems(len(source), seed=0)  # a data set's tasks know their length
    return [(task.prompt_template.replace("{prompt}", p.prompt), p.answer) for p in problems
            if p.answer and len(p.answer.encode()) < task.max_new_tokens]
