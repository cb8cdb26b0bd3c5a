"""Math datasets from JSONL or Parquet files (GSM8K, OpenR1-Math and alike) as a Task.

Field names and the form of the reference answer are configurable; the reward is the
final-answer match of rlboost.tasks.math_answers.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rlboost.tasks.base import Problem
from rlboost.tasks.math_answers import extract_boxed, math_reward

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


def load_math_problems(config: MathDatasetConfig) -> list[Problem]:
    """Read the file into Problems; a bad record raises ValueError naming file and record."""
    if config.path is None:
        raise ValueError("no math dataset file is set (path)")
    path = Path(config.path)
    if not path.is_file():
        raise FileNotFoundError(f"math dataset {path} does not exist")
    records = _read_parquet(path, config) if path.suffix == ".parquet" else _read_jsonl(path, config)
    problems = []
    for index, record in enumerate(records):
        where = f"{path} record {index + 1}"
        prompt, answer = record.get(config.prompt_field), record.get(config.answer_field)
        for field, value in ((config.prompt_field, prompt), (config.answer_field, answer)):
            if value is None:
                raise ValueError(f"{where}: field {field!r} is missing")
        try:
            gold = reference_answer(str(answer), config.answer_format)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        problems.append(Problem(problem_id=index, answer=gold, prompt=str(prompt)))
    if not problems:
        raise ValueError(f"math dataset {path} holds no records")
    return problems


def _read_jsonl(path: Path, config: MathDatasetConfig) -> list[dict]:
    records = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} line {line_no}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path} line {line_no}: expected a JSON object")
            records.append(record)
            if config.limit is not None and len(records) >= config.limit:
                break
    return records


def _read_parquet(path: Path, config: MathDatasetConfig) -> list[dict]:
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    missing = [f for f in (config.prompt_field, config.answer_field) if f not in schema.names]
    if missing:
        raise ValueError(f"{path}: columns {missing} not found (has {schema.names})")
    table = pq.read_table(path, columns=[config.prompt_field, config.answer_field])
    if config.limit is not None:
        table = table.slice(0, config.limit)
    return table.to_pylist()


class MathTask:
    """A fixed list of math problems; problems(n, seed) draws without replacement per pass."""

    name = "math"

    def __init__(self, problems: list[Problem]):
        if not problems:
            raise ValueError("MathTask needs at least one problem")
        self._problems = list(problems)

    @classmethod
    def from_file(cls, config: MathDatasetConfig) -> MathTask:
        return cls(load_math_problems(config))

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
