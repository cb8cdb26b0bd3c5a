"""The synthetic arithmetic task: seeded problems, correct answers, reward modes."""

import pytest

from rlboost.tasks import Problem, Task
from rlboost.tasks.arithmetic import ArithmeticConfig, ArithmeticTask


def test_problems_are_seeded_and_answers_are_correct():
    task = ArithmeticTask(ArithmeticConfig(max_operand=50, operators="+-*", num_operands=3))
    a, b = task.problems(200, seed=7), task.problems(200, seed=7)
    assert a == b and a != task.problems(200, seed=8)
    for p in a:
        expr = p.prompt
        assert expr.endswith("=")
        assert int(p.answer) == eval(expr[:-1])  # Python's precedence is the task's precedence
        assert int(p.answer) >= 0  # non_negative redraws negative results


def test_difficulty_knobs_bound_the_operands():
    task = ArithmeticTask(ArithmeticConfig(min_operand=10, max_operand=12))
    for p in task.problems(50, seed=0):
        left, right = p.prompt[:-1].split("+")
        assert 10 <= int(left) <= 12 and 10 <= int(right) <= 12


def test_negative_results_are_kept_when_allowed():
    task = ArithmeticTask(ArithmeticConfig(operators="-", non_negative=False))
    assert any(p.answer.startswith("-") for p in task.problems(100, seed=0))


def test_exact_reward():
    task = ArithmeticTask()
    p = Problem(problem_id=0, prompt="12+7=", answer="19")
    assert task.reward(p, "19") == 1.0
    assert task.reward(p, " 19\n") == 1.0
    assert task.reward(p, "18") == 0.0
    assert task.reward(p, "19 apples") == 0.0  # must be the number alone
    assert task.reward(p, "") == 0.0


def test_partial_credit_modes():
    p = Problem(problem_id=0, prompt="60+63=", answer="123")
    digits = ArithmeticTask(ArithmeticConfig(reward_mode="digits", partial_weight=0.5))
    assert digits.reward(p, "123") == 1.0
    assert digits.reward(p, "193") == pytest.approx(0.5 * 2 / 3)  # 2 of 3 digits, right-aligned
    assert digits.reward(p, "23") == pytest.approx(0.5 * 2 / 3)
    assert digits.reward(p, "-123") == 0.0
    assert digits.reward(p, "abc") == 0.0
    distance = ArithmeticTask(ArithmeticConfig(reward_mode="distance", format_reward=0.1,
                                               partial_weight=0.4))
    assert distance.reward(p, "113") == pytest.approx(0.1 + 0.4 * (1 - 10 / 123))
    assert distance.reward(p, "900") == pytest.approx(0.1)  # well-formed but far off
    assert distance.reward(p, "x") == 0.0


def test_warmup_pairs_follow_the_problem_distribution():
    task = ArithmeticTask()
    pairs = task.warmup_pairs(20, seed=3)
    assert pairs == [(p.prompt, p.answer) for p in task.problems(20, seed=3)]


def test_task_follows_the_protocol():
    assert isinstance(ArithmeticTask(), Task)


@pytest.mark.parametrize("kwargs,field", [
    ({"max_operand": -1}, "max_operand"), ({"num_operands": 1}, "num_operands"),
    ({"operators": "/"}, "operators"), ({"reward_mode": "fuzzy"}, "reward_mode"),
    ({"format_reward": 1.0}, "format_reward"),
    ({"format_reward": 0.5, "partial_weight": 0.5}, "partial_weight")])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ArithmeticConfig(**kwargs)


def test_a_config_without_any_non_negative_problem_is_refused_at_once():
    with pytest.raises(ValueError, match="non_negative"):
        ArithmeticConfig(min_operand=5, max_operand=9, operators="-", num_operands=3)
    ArithmeticConfig(min_operand=5, max_operand=10, operators="-", num_operands=3)  # 10-5-5 = 0 is possible
    ArithmeticConfig(min_operand=5, max_operand=9, operators="-", num_operands=3, non_negative=False)


def test_a_config_that_almost_never_draws_a_non_negative_problem_fails_instead_of_spinning():
    # satisfiable (a0 >= a1 + ... + a7 happens), but about once in 40 000 draws
    task = ArithmeticTask(ArithmeticConfig(max_operand=10**6, operators="-", num_operands=8))
    with pytest.raises(ValueError, match="draws in a row"):
        task.problems(50, seed=0)
