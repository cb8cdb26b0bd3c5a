"""The one place a run's task and its reward source are built from its TaskConfig: the
task by name (arithmetic, math, dataset), the rewards from task.reward (the task's own
check, or the user's function in a worker pool)."""

from __future__ import annotations

from typing import Callable

from rlboost.tasks.arithmetic import ArithmeticTask
from rlboost.tasks.base import Task
from rlboost.tasks.column_dataset import DatasetTask
from rlboost.tasks.config import TaskConfig
from rlboost.tasks.dataset import MathTask
from rlboost.tasks.reward.source import RewardSource, TaskReward


def build_task(config: TaskConfig, prompt_tokens: Callable[[str], int] | None = None) -> Task:
    """The task config.name names. prompt_tokens(prompt): a prompt's length in tokens as the
    model sees it, for datasets that drop long prompts."""
    return _TASKS[config.name](config, prompt_tokens)


def build_rewards(config: TaskConfig, task: Task) -> RewardSource:
    """The task's own reward, or the function task.reward names (imported here: a name that
    does not resolve is a ValueError before anything runs)."""
    if not config.reward:
        return TaskReward(task, extract=config.answer == "extract")
    from rlboost.tasks.reward.plugin import RewardTarget
    from rlboost.tasks.reward.pool import FunctionReward

    target = RewardTarget.parse(config.reward, batched=config.reward_batch_size > 0)
    return FunctionReward(target, workers=config.reward_workers, timeout_s=config.reward_timeout_s,
                          batch_size=max(1, config.reward_batch_size))


def reward_label(config: TaskConfig) -> str:
    return config.reward or f"the {config.name} task's reward"


_TASKS: dict[str, Callable[[TaskConfig, Callable[[str], int] | None], Task]] = {
    "arithmetic": lambda c, _: ArithmeticTask(c.arithmetic),
    "math": lambda c, _: MathTask.from_file(c.math),
    "dataset": lambda c, count: DatasetTask.from_config(c.dataset, count),
}
