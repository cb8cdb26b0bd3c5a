"""RewardSource: the one interface the trainer's feed scores samples through, and
TaskReward, the source behind the built-in tasks (their own reward(problem, completion)).
The other source, a user's function, is rlboost.tasks.reward.pool.FunctionReward."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from rlboost.tasks.base import Task
from rlboost.tasks.math_answers import extract_answer
from rlboost.tasks.reward.records import NOT_A_NUMBER, NotANumber, RewardRequest, RewardResult, read_value


@runtime_checkable
class RewardSource(Protocol):
    """Scores finished samples: one result per request, in order. A source never raises
    for what one sample's reward does; a failed sample is a RewardResult with failure set."""

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]: ...

    def close(self) -> None: ...


class TaskReward:
    """A built-in task's reward, in this process: a sample that did not stop on its own (cut
    off at max_new_tokens) earns 0; with extract, the final answer found in the completion
    (\\boxed{}, "the answer is", else the last number) is scored instead of the whole text.
    A check that raises on what a data set or a completion holds (a number too long to
    read, say) scores that sample 0 with the exception's class as its failure kind.

    >>> from rlboost.tasks.arithmetic import ArithmeticTask
    >>> from rlboost.tasks.base import Problem
    >>> request = RewardRequest(problem=Problem(problem_id=0, prompt="3+5=", answer="8"), completion="8",
    ...                         metadata={"finish_reason": "stop"})
    >>> TaskReward(ArithmeticTask()).score([request])[0].score
    1.0
    """

    def __init__(self, task: Task, *, extract: bool = False):
        self.task, self.extract = task, extract

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return [self._result(r) for r in requests]

    def _result(self, request: RewardRequest) -> RewardResult:
        try:
            return read_value(self._one(request))
        except NotANumber as e:
            return RewardResult.failing(NOT_A_NUMBER, str(e))
        except Exception as e:  # the task's check failed on this sample: it scores 0, counted by kind
            return RewardResult.failing(type(e).__name__, str(e) or repr(e))

    def _one(self, request: RewardRequest) -> float:
        if request.metadata.get("finish_reason") != "stop":
            return 0.0
        text = request.completion
        if self.extract:
            text = extract_answer(text) or ""
        return self.task.reward(request.problem, text)

    def close(self) -> None:
        pass
