"""Final-answer extraction and comparison for math completions (GSM8K, MATH, OpenR1).

Answers are compared as exact rationals when both sides read as numbers ("1,000", "0.5",
"\\frac{1}{2}", "50\\%"), and otherwise as normalised LaTeX strings.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Digits a number may have to be compared as a number. Python refuses to read integers of
# more than 4,300 digits (sys.get_int_max_str_digits), and no answer of a math data set
# comes near this; a longer one is hostile input.
MAX_NUMBER_DIGITS = 1000

_BOXED = ("\\boxed", "\\fbox")
_GSM8K = re.compile(r"####\s*(.+)")
_ANSWER_IS = re.compile(r"answer\s*(?:is\s*:?|:)\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_OPERAND_AFTER = re.compile(r"\s*[-+*/×÷=]")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d,])")
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\s*(\{[^{}]*\}|\d)\s*(\{[^{}]*\}|\d)")
_UNITS = re.compile(r"(?<=[\d}])\s*\\(?:text|mbox)\{\s*[a-zA-Z ]+\}$")
_ASSIGNMENT = re.compile(r"^[a-zA-Z]\w*\s*=\s*(?!=)")


class AnswerTooLong(ValueError):
    """A number with more than MAX_NUMBER_DIGITS digits in an answer or a completion: the
    reward refuses it (the sample scores 0, counted under this kind)."""


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5"), braces balanced."""
    start = max(text.rfind(b) for b in _BOXED)
    if start < 0:
        return None
    i = text.index("\\", start) + 1
    while i < len(text) and text[i].isalpha():
        i += 1
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        match = re.match(r"[^\s$]+", text[i:])
        return match.group(0) if match else None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None  # unbalanced: the completion was cut off inside the box


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, trying in order: the last \\boxed{...}, a GSM8K
    "#### x" line, "the answer is x", and the last number in the text that is not an operand
    (followed by an operator or "="). None if nothing fits.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed.strip()
    for pattern in (_GSM8K, _ANSWER_IS):
        matches = pattern.findall(text)
        if matches:
            answer = matches[-1].strip().rstrip(".").strip()
            number = _NUMBER.search(answer)
            # "The answer is 42 apples." -> 42; "The answer is \frac{1}{2}" stays whole.
            if number and "\\" not in answer:
                return number.group(0)
            if answer:
                return answer
    # A number followed by an operator or "=" is an operand ("8+2 =" states no answer).
    numbers = [m.group(0) for m in _NUMBER.finditer(text) if not _OPERAND_AFTER.match(text, m.end())]
    return numbers[-1] if numbers else None


def normalize_answer(answer: str) -> str:
    """Canonical string form: no $, spaces, \\left/\\right, unit text, thousands commas;
    \\dfrac and \\frac{a}{b} as a/b; numbers as reduced fractions or integers.
    """
    s = answer.strip().strip("$").strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "%")
    s = s.replace("\\$", "").replace("dfrac", "frac").replace("tfrac", "frac")
    s = _UNITS.sub("", s).strip()
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = _ASSIGNMENT.sub("", s)
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    s = _FRAC.sub(lambda m: f"{_operand(m.group(1))}/{_operand(m.group(2))}", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    if s.endswith("%") and _as_number(s[:-1]) is not None:
        s = s[:-1]
    number = _as_number(s)
    if number is not None:
        return str(number.numerator) if number.denominator == 1 else f"{number.numerator}/{number.denominator}"
    return s


def answers_match(predicted: str | None, gold: str) -> bool:
    """True when predicted equals gold as numbers or as normalised strings (gold is read
    first: a reference answer that cannot be compared fails every sample, not only those
    that state an answer)."""
    reference = normalize_answer(gold)
    return predicted is not None and normalize_answer(predicted) == reference


def math_reward(completion: str, gold: str) -> float:
    """1.0 when the completion's final answer matches gold, else 0.0."""
    return 1.0 if answers_match(extract_answer(completion), gold) else 0.0


def _operand(group: str) -> str:
    # Plain numbers need no parentheses ("3/4"); anything else keeps its grouping.
    inner = (group[1:-1] if group.startswith("{") else group).strip()
    return inner if re.fullmatch(r"-?\d+(\.\d+)?", inner) else f"({inner})"


def _as_number(s: str) -> Fraction | None:
    if not re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)(/[-+]?\d+(\.\d*)?)?", s):
        return None
    num, _, den = s.partition("/")
    digits = max(len(num), len(den))
    if digits > MAX_NUMBER_DIGITS:
        raise AnswerTooLong(f"a number of {digits:,} digits (more than {MAX_NUMBER_DIGITS:,})")
    try:
        value = Fraction(num) / Fraction(den) if den else Fraction(num)
    except ZeroDivisionError:
        return None
    return value
