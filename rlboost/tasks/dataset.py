"""Math datasets from JSONL or Parquet files (GSM8K, OpenR1-Math and alike) as a Task.

Field names and the form of the reference answer are configurable; the reward is the
final-answer match of rlboost.tasks.math_answers. A record that cannot be read (too long,
too deep, not UTF-8, no answer, ...) is refused and counted by cause, and the rest load.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from rlboost.tasks.base import Problem
from rlboost.tasks.math_answers import extract_boxed, math_reward
from rlboost.tasks.record_files import MAX_RECORD_BYTES, read_json_lines
from rlboost.tasks.refusals import Refusals

ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "plain")


@dataclass(kw_only=True, slots=True)
class MathDatasetConfig:
    """Where a math dataset lives and how to read it.

    answer_format says how to find the reference answer in answer_field: "gsm8k" takes
    the text after "####", "boxed" the last \\boxed{...} (OpenR1's `solution`), "plain"
    the whole field (OpenR1's `answer`), "auto" picks per record. Prompts are the question
    as it stands; a task's prompt_template wraps them. limit keeps the first N records.
    """

    path: str | None = None
    """JSONL or Parquet file of problems"""
    prompt_field: str = "question"
    """the record field holding the question"""
    answer_field: str = "answer"
    """the record field holding the reference answer"""
    answer_format: str = "auto"
    """how to find the answer in it: gsm8k (after ####), boxed, plain, or auto"""
    limit: int | None = None
    """read only the first N records (None: all)"""

    def __post_init__(self) -> None:
        if self.path is not None and not self.path:
            raise ValueError("path must not be empty (None: no dataset)")
        if not self.prompt_field or not self.answer_field:
            raise ValueError("prompt_field and answer_field must not be empty")
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, "
                             f"got {self.answer_format!r}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be None or >= 1, got {self.limit}")


def reference_answer(field: str, answer_format: str) -> str:
    """The final answer inside a dataset's answer field (see MathDatasetConfig)."""
    if answer_format == "auto":
        answer_format = "gsm8k" if "####" in field else "boxed" if "\\boxed" in field else "plain"
    if answer_format == "gsm8k":
        if "####" not in field:
            raise ValueError(f"no '####' in GSM8K answer {field[-80:]!r}")
        return field.rsplit("####", 1)[1].strip()
    if answer_format == "boxed":
        boxed = extract_boxed(field)
        if boxed is None:
            raise ValueError(f"no complete \\boxed{{...}} in answer {field[-80:]!r}")
        return boxed.strip()
    return field.strip()


def load_math_problems(config: MathDatasetConfig, refusals: Refusals | None = None) -> list[Problem]:
    """Read the file into Problems. A record that cannot be read is left out and counted in
    refusals (by cause, the first of each logged naming file and record); ValueError in one
    line when none is left."""
    if config.path is None:
        raise ValueError("no math dataset file is set (path)")
    path = Path(config.path)
    if not path.is_file():
        raise FileNotFoundError(f"math dataset {path} does not exist")
    refusals = refusals if refusals is not None else Refusals(str(path))
    records = _read_parquet(path, config, refusals) if path.suffix == ".parquet" else read_json_lines(path, refusals)
    problems = []
    for where, record in records:
        problem = _problem(record, len(problems), config, refusals, where)
        if problem is not None:
            problems.append(problem)
            if config.limit is not None and len(problems) >= config.limit:
                break
    if not problems:
        raise refusals.nothing_left()
    return problems


def _problem(record: dict, index: int, config: MathDatasetConfig, refusals: Refusals, where: str) -> Problem | None:
    prompt, answer = record.get(config.prompt_field), record.get(config.answer_field)
    for field, value in ((config.prompt_field, prompt), (config.answer_field, answer)):
        if value is None:
            refusals.refuse(where, "missing field", f"field {field!r} is missing")
            return None
    if not isinstance(prompt, str) or not prompt.strip():
        refusals.refuse(where, "not a prompt", f"field {config.prompt_field!r} holds {type(prompt).__name__} "
                                               f"{str(prompt)[:40]!r}, not a non-empty string")
        return None
    text = str(answer)
    if len(prompt) + len(text) > MAX_RECORD_BYTES:
        refusals.refuse(where, "too long", f"longer than {MAX_RECORD_BYTES:,} characters")
        return None
    try:
        gold = reference_answer(text, config.answer_format)
    except ValueError as exc:
        refusals.refuse(where, "no answer", str(exc))
        return None
    return Problem(problem_id=index, answer=gold, prompt=prompt)


def _read_parquet(path: Path, config: MathDatasetConfig, refusals: Refusals) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        missing = [f for f in (config.prompt_field, config.answer_field) if f not in schema.names]
        if missing:
            raise ValueError(f"{path}: columns {missing} not found (has {schema.names})")
        table = pq.read_table(path, columns=[config.prompt_field, config.answer_field])
    except ValueError:
        raise
    except Exception as e:  # pyarrow's errors for a damaged file
        raise ValueError(f"{path} does not read as Parquet: {type(e).__name__}: {' '.join(str(e).split())[:200]}") \
            from None
    for index, record in enumerate(table.to_pylist(), 1):
        yield f"row {index}", record


class MathTask:
    """A fixed list of math problems; problems(n, seed) draws without replacement per pass.
    refused: how many records of its file were left out at load, by cause."""

    name = "math"

    def __init__(self, problems: list[Problem], *, refused: dict[str, int] | None = None):
        if not problems:
            raise ValueError("MathTask needs at least one problem")
        self._problems = list(problems)
        self.refused = dict(refused or {})  # records of the file left out at load, by cause

    @classmethod
    def from_file(cls, config: MathDatasetConfig) -> MathTask:
        refusals = Refusals(str(config.path))
        return cls(load_math_problems(config, refusals), refused=refusals.as_dict())

    def __len__(self) -> int:
        return len(self._problems)

    def problems(self, n: int, *, seed: int) -> list[Problem]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = random.Random(seed)
        out: list[Problem] = []
        while len(out) < n:
            order = list(self._problems)
            rng.shuffle(order)
            out.extend(order[:n - len(out)])
        return out

    def reward(self, problem: Problem, completion: str) -> float:
        return math_reward(completion, problem.answer)
