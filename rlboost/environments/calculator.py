"""The calculator: a tool for the arithmetic task. A model turn that ends with a call such as
"[12*7+3]" is answered with the exact result ("87"); a turn without a call is the answer,
scored by the task's own reward. The expression is parsed by a small bounded grammar over
exact fractions (never eval): + - * / ^, parentheses, decimal numbers, with limits on its
length, nesting and the size of every intermediate value, so no input makes it slow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from rlboost.environments.base import ModelTurn, StepResult
from rlboost.environments.tool_calls import ToolCallFormat
from rlboost.tasks.base import Problem
from rlboost.validate import require

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(\*\*|[-+*/^()]))")


class CalculatorError(ValueError):
    """An expression the calculator does not compute: malformed, too long, too deep, too large,
    or a division by zero. Its message is what the model reads back."""


@dataclass(kw_only=True, slots=True)
class CalculatorConfig:
    """The calculator's tags and bounds.

    >>> CalculatorConfig().open, CalculatorConfig().close
    ('[', ']')
    """

    open: str = "["
    """tag that opens a call"""
    close: str = "]"
    """tag that ends a call and the model's turn (one token of the model's tokenizer)"""
    max_chars: int = 200
    """longest expression"""
    max_depth: int = 32
    """deepest nesting of parentheses and unary signs"""
    max_digits: int = 200
    """largest numerator or denominator of any intermediate value, in decimal digits"""

    def __post_init__(self) -> None:
        require(bool(self.open) and bool(self.close), "environment.calculator.open/close", "non-empty tags",
                (self.open, self.close))
        require(1 <= self.max_chars <= 100_000, "environment.calculator.max_chars", "in [1, 100000]",
                self.max_chars)
        require(1 <= self.max_depth <= 200, "environment.calculator.max_depth", "in [1, 200]", self.max_depth)
        require(1 <= self.max_digits <= 10_000, "environment.calculator.max_digits", "in [1, 10000]",
                self.max_digits)


def evaluate(expression: str, config: CalculatorConfig | None = None) -> Fraction:
    """The exact value of an arithmetic expression; CalculatorError for anything else.

    >>> evaluate("12*7+3"), evaluate("-(1.5 + 2) / 7"), evaluate("2^10")
    (Fraction(87, 1), Fraction(-1, 2), Fraction(1024, 1))
    """
    config = config or CalculatorConfig()
    if len(expression) > config.max_chars:
        raise CalculatorError(f"expression longer than {config.max_chars} characters")
    return _Parser(_tokens(expression), config).parse()


def format_value(value: Fraction) -> str:
    """An exact value as text: an integer, else a fraction in lowest terms ("7/2")."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text):
        if text[at:].isspace():
            break
        match = _TOKEN.match(text, at)
        if match is None:
            raise CalculatorError(f"unexpected {text[at:].lstrip()[:1]!r}")
        out.append(match.group(1) or ("^" if match.group(2) == "**" else match.group(2)))
        at = match.end()
    if not out:
        raise CalculatorError("empty expression")
    return out


class _Parser:
    """expr := term (+|- term)*; term := unary (*|/ unary)*; unary := (+|-) unary | power;
    power := atom (^ unary)?; atom := number | ( expr )."""

    def __init__(self, tokens: list[str], config: CalculatorConfig):
        self.tokens, self.at, self.depth, self.config = tokens, 0, 0, config

    def parse(self) -> Fraction:
        value = self._expr()
        if self.at != len(self.tokens):
            raise CalculatorError(f"unexpected {self.tokens[self.at]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise CalculatorError("the expression ends too early")
        self.at += 1
        return token

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            value = self._bounded(value + self._term() if self._take() == "+" else value - self._term())
        return value

    def _term(self) -> Fraction:
        value = self._unary()
        while self._peek() in ("*", "/"):
            op, right = self._take(), self._unary()
            if op == "/" and right == 0:
                raise CalculatorError("division by zero")
            value = self._bounded(value * right if op == "*" else value / right)
        return value

    def _unary(self) -> Fraction:
        if self._peek() in ("+", "-"):
            sign = self._take()
            value = self._nested(self._unary)
            return -value if sign == "-" else value
        return self._power()

    def _power(self) -> Fraction:
        base = self._atom()
        if self._peek() != "^":
            return base
        self._take()
        exponent = self._nested(self._unary)
        if exponent.denominator != 1:
            raise CalculatorError("only whole exponents")
        if base == 0 and exponent < 0:
            raise CalculatorError("division by zero")
        size = max(len(str(base.numerator)), len(str(base.denominator))) * abs(int(exponent))
        if base not in (0, 1, -1) and size > self.config.max_digits:
            raise CalculatorError(f"result larger than {self.config.max_digits} digits")
        return self._bounded(base ** int(exponent))

    def _atom(self) -> Fraction:
        token = self._take()
        if token == "(":
            value = self._nested(self._expr)
            if self._peek() != ")":
                raise CalculatorError("missing ')'")
            self._take()
            return value
        if token[0].isdigit():
            if len(token) > self.config.max_digits:
                raise CalculatorError(f"number longer than {self.config.max_digits} digits")
            return Fraction(token)
        raise CalculatorError(f"unexpected {token!r}")

    def _nested(self, parse) -> Fraction:
        self.depth += 1
        if self.depth > self.config.max_depth:
            raise CalculatorError(f"nested deeper than {self.config.max_depth}")
        try:
            return parse()
        finally:
            self.depth -= 1

    def _bounded(self, value: Fraction) -> Fraction:
        limit = 10 ** self.config.max_digits
        if abs(value.numerator) >= limit or value.denominator >= limit:
            raise CalculatorError(f"result larger than {self.config.max_digits} digits")
        return value


class CalculatorEnvironment:
    """One arithmetic episode with a calculator: the prompt is the problem's; a turn that
    ends with a call is answered with its result (or "error: ..." for an expression the
    calculator refuses), a turn without one ends the episode and is the answer the task's
    reward scores. `calls` counts the calls this episode executed.
    """

    def __init__(self, config: CalculatorConfig | None = None):
        self.config = config or CalculatorConfig()
        self.tool_call = ToolCallFormat(open=self.config.open, close=self.config.close)
        self.calls = 0

    def reset(self, problem: Problem) -> str:
        return problem.prompt

    def step(self, turn: ModelTurn) -> StepResult:
        expression = self.tool_call.find_call(turn.text) if turn.finish_reason == "stop" else None
        if expression is None:
            return StepResult(done=True)
        self.calls += 1
        try:
            return StepResult(observation=format_value(evaluate(expression, self.config)), done=False)
        except CalculatorError as e:
            return StepResult(observation=f"error: {e}", done=False)
