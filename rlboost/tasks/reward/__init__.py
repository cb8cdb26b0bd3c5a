"""Rewards: one small interface (RewardSource.score) with several sources behind it: a
built-in task's own check (TaskReward), or a user's function named in the config
(FunctionReward), which runs in a pool of worker processes with a timeout per call.
"""

from rlboost.tasks.reward.records import RewardRequest, RewardResult
from rlboost.tasks.reward.source import RewardSource, TaskReward

__all__ = ["RewardRequest", "RewardResult", "RewardSource", "TaskReward"]
