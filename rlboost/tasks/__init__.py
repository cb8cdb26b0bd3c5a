"""Verifiable-reward tasks: prompts with reference answers and a reward for a completion.

`arithmetic` is a synthetic task a tiny byte-level model learns on a CPU; `dataset` loads
GSM8K / OpenR1-style math sets checked by `math_answers`.
"""

from rlboost.tasks.base import Problem, Task

__all__ = ["Problem", "Task"]
