"""The calculator: exact results of what it parses, a one-line refusal (read back by the model)
for everything else, hostile input included; the turn convention that ends a model turn at
its closing tag; and an arithmetic episode with it."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlboost.environments import ModelTurn, ToolCallFormat
from rlboost.environments.calculator import CalculatorEnvironment, CalculatorError, evaluate, format_value
from rlboost.errors import ConfigError
from rlboost.models.byte_tokenizer import ByteTokenizer
from rlboost.tasks.arithmetic import ArithmeticConfig, ArithmeticTask


@pytest.mark.parametrize("expression,value", [
    ("12*7+3", 87), ("3+5*2", 13), ("(3+5)*2", 16), ("10-4-3", 3), ("2^3^2", 512), ("2**10", 1024),
    ("-3*-3", 9), ("7/2", Fraction(7, 2)), ("0.1+0.2", Fraction(3, 10)), (" 1 + 1 ", 2), ("2^-2", Fraction(1, 4)),
])
def test_it_computes_exactly(expression, value):
    assert evaluate(expression) == value


def test_every_result_of_the_arithmetic_task_is_what_the_task_says():
    task = ArithmeticTask(ArithmeticConfig(max_operand=999, num_operands=5, operators="+-*", non_negative=False))
    for problem in task.problems(200, seed=3):
        assert format_value(evaluate(problem.prompt.rstrip("="))) == problem.answer


@pytest.mark.parametrize("expression,says", [
    ("", "empty"), ("1/0", "division by zero"), ("0^-1", "division by zero"), ("2^0.5", "whole exponents"),
    ("__import__('os')", "unexpected '_'"), ("1 +", "ends too early"), ("(1+2", "missing ')'"), ("1 2", "unexpected '2'"),
    ("9^9^9", "larger than 200 digits"), ("9" * 5000, "longer than 200 characters"),
    ("(" * 500 + "1" + ")" * 500, "longer than"), ("(" * 40 + "1" + ")" * 40, "nested deeper than 32"),
    ("-" * 150 + "1", "nested deeper"), ("9^199*9^199", "larger than 200 digits"),
    ("1e9", "unexpected 'e'"), ("\udcff", "unexpected"),
])
def test_it_refuses_what_it_does_not_compute_in_one_line(expression, says):
    with pytest.raises(CalculatorError) as err:
        evaluate(expression)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_turn_ends_at_the_closing_tag_and_only_a_one_token_tag_can_end_it():
    calc = ToolCallFormat(open="[", close="]")
    assert calc.find_call("first [2*3]") == "2*3" and calc.find_call("[2*3] then 6") is None
    assert calc.find_call("6") is None and calc.find_call("no open]") is None
    assert calc.stop_token_ids(ByteTokenizer()) == (ord("]"),)
    with pytest.raises(ConfigError, match="closing tag '</calc>' is 7 tokens"):
        ToolCallFormat(open="<calc>", close="</calc>").stop_token_ids(ByteTokenizer())


def test_an_arithmetic_episode_calls_the_calculator_then_answers():
    task = ArithmeticTask(ArithmeticConfig(max_operand=99, operators="*"))
    problem = task.problems(1, seed=0)[0]
    env, tok = CalculatorEnvironment(), ByteTokenizer()
    assert env.reset(problem) == problem.prompt
    expr = problem.prompt.rstrip("=")
    call = env.step(ModelTurn(text=f"[{expr}]", token_ids=tuple(tok.encode(f"[{expr}]"))))
    bad = env.step(ModelTurn(text="[2^0.5]", token_ids=tuple(tok.encode("[2^0.5]"))))
    cut = env.step(ModelTurn(text="[1+", token_ids=tuple(tok.encode("[1+")), finish_reason="length"))
    answer = env.step(ModelTurn(text=call.observation, token_ids=tuple(tok.encode(call.observation))))
    assert (call.observation, call.done) == (problem.answer, False)
    assert (bad.observation, bad.done) == ("error: only whole exponents", False)
    assert cut.done and answer.done and answer.reward is None and env.calls == 2
    assert task.reward(problem, call.observation) == 1.0
