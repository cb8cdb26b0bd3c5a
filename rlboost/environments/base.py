"""The environment interface: an episode starts from a task's Problem (reset) and goes on one
model turn at a time (step), each answered by an observation, a done flag and, optionally, a
reward. ModelTurn and StepResult cross from the episode driver to the environment host and
back, so they are frozen, versioned records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rlboost.environments.tool_calls import ToolCallFormat
from rlboost.tasks.base import Problem
from rlboost.validate import check_format_version

ENVIRONMENT_RECORD_FORMAT_VERSION = 1
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelTurn:
    """What the model wrote in one turn: its decoded text and its token ids, and whether it
    stopped on a stop token (a tool call's closing tag or the end of its answer) or ran out
    of tokens.

    >>> ModelTurn(text="[3+5]", token_ids=(91, 51, 43, 53, 93), finish_reason="stop").text
    '[3+5]'
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str = "stop"
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.token_ids):
            raise ValueError("token_ids must be non-negative ints")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepResult:
    """An environment's answer to one model turn. observation: text the model reads next
    (empty when done); reward: the episode's reward when the environment scores it (None:
    the task's reward scores the final turn). failure names the kind of fault when the
    environment raised, hung or answered with something else ("timeout", an exception's
    class name); such a step ends the episode, and error holds the first line of the fault.

    >>> StepResult(observation="8", done=False)
    StepResult(observation='8', done=False, reward=None, failure=None, error='', format_version=1)
    """

    observation: str = ""
    done: bool
    reward: float | None = None
    failure: str | None = None
    error: str = ""
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)
        if not isinstance(self.observation, str):
            raise ValueError(f"observation must be text, got {type(self.observation).__name__}")
        if self.reward is not None and not (isinstance(self.reward, (int, float)) and math.isfinite(self.reward)):
            raise ValueError(f"reward must be None or a finite number, got {self.reward!r}")
        if self.failure is not None and not self.done:
            raise ValueError("a failed step must end the episode (done=True)")

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @classmethod
    def failing(cls, kind: str, error: str) -> StepResult:
        """The result that stands for a step whose environment failed: it ends the episode."""
        return cls(done=True, failure=kind, error=" ".join(str(error).split())[:300])


@runtime_checkable
class Environment(Protocol):
    """One episode's environment, made fresh for each sample (by its class, called with the
    config's options as keywords) and used from one thread at a time.

    reset(problem) -> the text of the episode's first prompt (usually problem.prompt, perhaps
    with instructions on the tool). step(turn) -> StepResult. close() releases what the
    episode holds (a folder, a process); it may be absent.

    tool_call: the tags a model turn that calls the tool ends with; the
    episode driver stops each turn at the closing tag. None: turns end only at the end of
    the model's answer (an environment that answers every turn, a game).

    A step may block (a tool that takes seconds): the host runs it on a worker thread with a
    timeout. What it raises, or a result that is not a StepResult, ends that episode as a
    failure counted by kind; the host and every other episode go on.
    """

    tool_call: ToolCallFormat | None

    def reset(self, problem: Problem) -> str: ...

    def step(self, turn: ModelTurn) -> StepResult: ...
