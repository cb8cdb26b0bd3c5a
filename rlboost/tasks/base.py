"""The task protocol: where prompts come from and how a completion is scored.

Rewards are computed from decoded text, so a task works with any tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

from rlboost.validate import check_format_version

PROBLEM_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One prompt and the answer a correct completion must produce; row holds the dataset
    record it came from (every column, for a reward function), empty for generated ones.

    >>> Problem(problem_id=4, prompt="12+7=", answer="19")
    Problem(problem_id=4, prompt='12+7=', answer='19', row={}, format_version=1)
    """

    problem_id: int
    prompt: str
    answer: str
    row: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = PROBLEM_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, PROBLEM_FORMAT_VERSION)
        if not self.prompt:
            raise ValueError(f"problem {self.problem_id}: prompt must not be empty")


@runtime_checkable
class Task(Protocol):
    """A source of problems plus a verifiable reward.

    problems(n, seed) is deterministic in (n, seed); reward(problem, completion) maps the
    decoded completion (without the end-of-sequence token) to a float, 1.0 meaning correct.
    """

    name: str

    def problems(self, n: int, *, seed: int) -> list[Problem]: ...

    def reward(self, problem: Problem, completion: str) -> float: ...
