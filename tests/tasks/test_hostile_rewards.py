"""A reward fails in one way only, whatever the data set or the completion holds: the sample
scores 0 and its failure is counted by kind. Hostile values here: numbers past Python's
integer-string limit (4,300 digits) in a reference answer or a completion, a task reward
that raises, and a row nested deeper than the pickler goes (which used to kill the reward
pool's scheduler thread and hang every later call)."""

from __future__ import annotations

import threading

import pytest

from rlboost.tasks.base import Problem
from rlboost.tasks.dataset import MathTask
from rlboost.tasks.math_answers import AnswerTooLong, math_reward
from rlboost.tasks.reward.ledger import RewardLedger
from rlboost.tasks.reward.plugin import RewardTarget
from rlboost.tasks.reward.records import RewardRequest
from rlboost.tasks.reward.source import TaskReward

HUGE = "7" * 5000  # past sys.get_int_max_str_digits() (4,300)


def _request(problem: Problem, completion: str) -> RewardRequest:
    return RewardRequest(problem=problem, completion=completion, metadata={"finish_reason": "stop"})


def test_a_huge_number_in_an_answer_or_a_completion_scores_zero_and_is_counted():
    big, small = Problem(problem_id=0, prompt="big?", answer=HUGE), Problem(problem_id=1, prompt="q", answer="4")
    rewards = TaskReward(MathTask([big, small]))
    results = rewards.score([_request(big, HUGE), _request(small, f"the answer is {HUGE}"),
                             _request(small, "#### 4")])
    assert [r.score for r in results] == [0.0, 0.0, 1.0]
    assert results[0].failed and results[1].failed and not results[2].failed
    assert "digits" in results[0].error
    ledger = RewardLedger("the math task's reward")
    ledger.add(results)
    assert ledger.take()["reward_failures_by_kind"] == {results[0].failure: 2}


def test_the_math_reward_refuses_hostile_numbers_with_its_own_error():
    for completion in (HUGE, f"\\boxed{{{HUGE}}}", f"{HUGE}/{HUGE}", "1" * 200_000 + ".5"):
        with pytest.raises(AnswerTooLong, match="digits"):
            math_reward(completion, "4")
    assert math_reward("\\frac{" * 5000, "4") == 0.0
    assert math_reward("#### 4", "4") == 1.0


class RaisingTaskForTests:
    name = "raising"

    def problems(self, n, *, seed):
        return [Problem(problem_id=i, prompt="p", answer="a") for i in range(n)]

    def reward(self, problem, completion):
        if completion == "boom":
            raise ZeroDivisionError("division by zero in the checker")
        return 1.0


def test_a_task_reward_that_raises_scores_that_sample_zero_and_names_its_kind():
    task = RaisingTaskForTests()
    problem = task.problems(1, seed=0)[0]
    results = TaskReward(task).score([_request(problem, "boom"), _request(problem, "fine")])
    assert (results[0].score, results[0].failure) == (0.0, "ZeroDivisionError")
    assert "division by zero" in results[0].error
    assert results[1].score == 1.0 and not results[1].failed


def _deep(levels: int) -> dict:
    row: dict = {"leaf": 1}
    for _ in range(levels):
        row = {"down": row}
    return row


@pytest.fixture
def plain_module(tmp_path):
    path = tmp_path / "deep_rewards.py"
    path.write_text("def score(prompt, completion, row, metadata):\n    return 1.0\n")
    return path


def test_a_row_too_deep_to_cross_to_a_worker_scores_zero_and_the_pool_goes_on(plain_module):
    pytest.importorskip("pebble")
    from rlboost.tasks.reward.pool import FunctionReward

    ok = Problem(problem_id=0, prompt="p", answer="a", row={"answer": "a"})
    deep = Problem(problem_id=1, prompt="p", answer="a", row=_deep(50_000))
    results: list = []
    with FunctionReward(RewardTarget.parse(f"{plain_module}:score"), workers=1, timeout_s=10) as rewards:
        calls = threading.Thread(target=lambda: results.extend(
            [rewards.score([_request(ok, "x"), _request(deep, "x")]), rewards.score([_request(ok, "x")] * 2)]),
            daemon=True)
        calls.start()
        calls.join(120)
        assert not calls.is_alive(), "score() hung on a row it could not send"
    first, second = results
    assert first[0].score == 1.0 and first[1].score == 0.0 and first[1].failed
    assert "row" in first[1].error
    assert [r.score for r in second] == [1.0, 1.0]  # the pool still serves


def test_a_pool_whose_scheduler_died_is_rebuilt(plain_module):
    pytest.importorskip("pebble")
    from rlboost.tasks.reward.pool import FunctionReward

    ok = Problem(problem_id=0, prompt="p", answer="a", row={"answer": "a"})
    with FunctionReward(RewardTarget.parse(f"{plain_module}:score"), workers=1, timeout_s=10) as rewards:
        assert rewards.score([_request(ok, "x")])[0].score == 1.0
        rewards._pool._context.status = 4  # pebble's PoolStatus.ERROR: what a dead scheduler thread leaves
        assert [r.score for r in rewards.score([_request(ok, "x")] * 2)] == [1.0, 1.0]
