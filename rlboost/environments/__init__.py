"""Multi-turn episodes: an Environment answers each model turn (a tool's result, a game's next
move) until the episode is done. The host runs a run's environments, one per sample, off the
preemptible instances and executes every tool call exactly once; a Trajectory holds an
episode's tokens with a mask of those the model wrote. Built in: a calculator for the
arithmetic task and a bounded Python sandbox for math answers; a user's class is named by
environment.name, as a reward function is by task.reward.
"""

from rlboost.environments.base import Environment, ModelTurn, StepResult
from rlboost.environments.config import EnvironmentConfig
from rlboost.environments.records import EpisodeOpening, HostStats, ToolCall, ToolReply, call_id
from rlboost.environments.tool_calls import ToolCallFormat
from rlboost.environments.trajectory import EnvironmentHandle, ToolRecord, Trajectory, turn_seed

__all__ = ["Environment", "EnvironmentConfig", "EnvironmentHandle", "EpisodeOpening", "HostStats", "ModelTurn",
           "StepResult", "ToolCall", "ToolCallFormat", "ToolRecord", "ToolReply", "Trajectory", "call_id",
           "turn_seed"]
