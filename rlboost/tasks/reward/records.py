"""What crosses to a reward worker and back: RewardRequest (one finished sample, as text)
and RewardResult (its score, the named parts a function returned, or why it scored 0).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping

from rlboost.tasks.base import Problem
from rlboost.validate import check_format_version

REWARD_RECORD_FORMAT_VERSION = 1
# failure kinds that are not an exception class's name
TIMEOUT, NOT_A_NUMBER, WORKER_DIED, UNSENDABLE = "timeout", "not a number", "worker died", "unsendable"


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardRequest:
    """One finished sample to score.

    >>> RewardRequest(problem=Problem(problem_id=0, prompt="3+5=", answer="8"), completion="8",
    ...               metadata={"sample_id": 7, "finish_reason": "stop"}).completion
    '8'

    completion: the decoded output without its end token. metadata: sample_id, group_id,
    problem_id, step, weight_version, finish_reason ("stop" or "length"), output_tokens,
    answer (the problem's reference answer).
    """

    problem: Problem
    completion: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = REWARD_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, REWARD_RECORD_FORMAT_VERSION)

    @property
    def row(self) -> dict[str, Any]:
        """The dataset row the problem came from (a built-in task's: its prompt and answer)."""
        return dict(self.problem.row) if self.problem.row else {"prompt": self.problem.prompt,
                                                                "answer": self.problem.answer}


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardResult:
    """A sample's reward; a failed call scores 0 with failure naming its kind (the
    exception's class, "timeout", "not a number", "worker died" or "unsendable": its row could
    not be sent to a reward worker) and error its message.

    >>> RewardResult(score=0.5, parts={"format": 1.0}).failed
    False
    """

    score: float
    parts: Mapping[str, float] = field(default_factory=dict)
    failure: str | None = None
    error: str = ""
    format_version: int = REWARD_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, REWARD_RECORD_FORMAT_VERSION)

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @classmethod
    def failing(cls, kind: str, error: str) -> RewardResult:
        return cls(score=0.0, failure=kind, error=" ".join(error.split())[:300])


class NotANumber(ValueError):
    """A reward function returned something other than a finite number or a dict with one."""


def read_value(value: Any) -> RewardResult:
    """A reward function's return value as a result: a finite number, or a dict holding a
    finite number under "score" plus named parts (each a finite number). NotANumber else.

    >>> read_value({"score": 1, "format": 0.5}).parts
    {'format': 0.5}
    """
    if isinstance(value, Mapping):
        if "score" not in value:
            raise NotANumber(f"a dict without 'score' (keys {sorted(map(str, value))[:8]})")
        parts = {str(k): _number(v, f"part {k!r}") for k, v in value.items() if k != "score"}
        return RewardResult(score=_number(value["score"], "score"), parts=parts)
    return RewardResult(score=_number(value, "the reward"))


def _number(value: Any, what: str) -> float:
    if not isinstance(value, numbers.Real):
        raise NotANumber(f"{what} is {type(value).__name__} {str(value)[:60]!r}, not a number")
    number = float(value)
    if not math.isfinite(number):
        raise NotANumber(f"{what} is {number}, not a finite number")
    return number
