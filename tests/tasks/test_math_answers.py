"""Final-answer extraction and matching on hand-written completions."""

import pytest

from rlboost.tasks.math_answers import answers_match, extract_answer, extract_boxed, math_reward, normalize_answer


@pytest.mark.parametrize("text,expected", [
    ("So the total is \\boxed{42}.", "42"),
    ("First \\boxed{1}, then corrected: \\boxed{2}", "2"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("$\\boxed 5$", "5"),
    ("\\fbox{7}", "7"),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
    ("#### 1,234 dollars", "1,234"),
    ("The answer is 17 apples.", "17"),
    ("Therefore, the answer is: \\frac{3}{4}.", "\\frac{3}{4}"),
    ("I think 3 + 4 = 7, so maybe 8?", "8"),
    ("2 + 5 = 7", "7"),
    ("8+2 =", None),  # the question repeated states no answer
    ("It costs -2.5 degrees", "-2.5"),
    ("no numbers here", None),
    ("cut off \\boxed{12", "12"),  # unbalanced box: fall back to the last number
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_boxed_handles_nesting_and_truncation():
    assert extract_boxed("\\boxed{a{b{c}}d}") == "a{b{c}}d"
    assert extract_boxed("\\boxed{open") is None
    assert extract_boxed("nothing") is None


@pytest.mark.parametrize("raw,canonical", [
    ("42", "42"), ("42.0", "42"), ("042", "42"), ("1,000", "1000"), ("1,234,567", "1234567"),
    ("$18.00$", "18"), ("\\$18", "18"), ("0.5", "1/2"), ("\\frac{1}{2}", "1/2"),
    ("\\dfrac{2}{4}", "1/2"), ("\\frac12", "1/2"), ("\\tfrac{3}{4}", "3/4"),
    ("-\\frac{3}{4}", "-3/4"), ("\\frac{-3}{4}", "-3/4"), ("3 / 4", "3/4"), ("50\\%", "50"),
    ("50%", "50"), ("90^\\circ", "90"), ("x = 5", "5"), ("5 \\text{ cm}", "5"),
    ("\\text{Yes}", "Yes"), ("\\left( 1, 2 \\right)", "(1,2)"), ("12.", "12"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}"), ("\\frac{\\pi}{2}", "(\\pi)/2"),
    ("2\\sqrt{2}", "2\\sqrt{2}"), (".5", "1/2"),
])
def test_normalize_answer(raw, canonical):
    assert normalize_answer(raw) == canonical


@pytest.mark.parametrize("pred,gold,same", [
    ("0.5", "\\frac{1}{2}", True), ("1000", "1,000", True), ("18.00", "18", True),
    ("\\dfrac{\\pi}{2}", "\\frac{\\pi}{2}", True), ("x=3", "3", True),
    ("3", "4", False), ("0.33", "\\frac{1}{3}", False), (None, "3", False),
    ("(1,2)", "(1, 2)", True), ("\\sqrt{2}", "\\sqrt{3}", False),
])
def test_answers_match(pred, gold, same):
    assert answers_match(pred, gold) is same


def test_math_reward_on_whole_completions():
    assert math_reward("Adding them: 40 + 32 = 72.\n#### 72", "72") == 1.0
    assert math_reward("Thus $\\boxed{\\dfrac{6}{8}}$", "\\frac{3}{4}") == 1.0
    assert math_reward("The result is 71", "72") == 0.0
    assert math_reward("", "72") == 0.0
