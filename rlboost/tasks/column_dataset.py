"""DatasetTask: prompts (and reference answers) from any table a user has, through the
Hugging Face `datasets` library: a local JSONL, Parquet or CSV file, or a folder written by
`save_to_disk`, with the columns named in the config; every column of a row reaches the
reward function. Read offline unless told otherwise; prompts longer than max_prompt_tokens
(after the prompt template) are dropped and counted."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlboost.tasks.base import Problem
from rlboost.tasks.dataset import ANSWER_FORMATS, MathTask, reference_answer
from rlboost.validate import require

log = logging.getLogger(__name__)
FILE_KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
INSTALL_HINT = "task.name=dataset reads datasets with the `datasets` package: pip install 'rlboost[datasets]'"


@dataclass(kw_only=True, slots=True)
class ColumnDatasetConfig:
    """Where the dataset is and which columns hold what.

    >>> ColumnDatasetConfig(path="train.parquet", prompt_key="question", answer_key="solution").split
    'train'

    path: a .jsonl/.json, .parquet or .csv file, or a folder saved with `save_to_disk` (a
    Dataset, or a DatasetDict whose `split` is taken); a hub name only with online=True.
    answer_key: the reference answer's column (None: no answer; then task.reward must name
    a function); answer_format says how to read it for the built-in final-answer check
    (as task.math.answer_format). max_prompt_tokens: drop prompts longer than this (None:
    keep all).
    """

    path: str | None = None
    """a local .jsonl, .parquet or .csv file, or a folder saved with save_to_disk"""
    split: str = "train"
    """the split to read (of a saved DatasetDict or a hub dataset)"""
    prompt_key: str = "prompt"
    """the column holding the prompt"""
    answer_key: str | None = "answer"
    """the column holding the reference answer (None: none, a reward function scores)"""
    answer_format: str = "plain"
    """how to find the answer in it: gsm8k (after ####), boxed, plain, or auto"""
    max_prompt_tokens: int | None = None
    """drop prompts longer than this many tokens, template included (None: keep all)"""
    limit: int | None = None
    """read only the first N rows (None: all)"""
    online: bool = False
    """let the datasets library download a hub dataset named by path"""

    def __post_init__(self) -> None:
        require(self.path is None or bool(self.path), "task.dataset.path", "a file, a folder or None", self.path)
        require(bool(self.prompt_key), "task.dataset.prompt_key", "a column name", self.prompt_key)
        require(self.answer_key is None or bool(self.answer_key), "task.dataset.answer_key",
                "a column name or None", self.answer_key)
        require(self.answer_format in ANSWER_FORMATS, "task.dataset.answer_format", f"one of {ANSWER_FORMATS}",
                self.answer_format)
        require(self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, "task.dataset.max_prompt_tokens",
                ">= 1 or None", self.max_prompt_tokens)
        require(self.limit is None or self.limit >= 1, "task.dataset.limit", ">= 1 or None", self.limit)


def load_table(config: ColumnDatasetConfig):
    """The dataset as a `datasets.Dataset`; ValueError (one line) for a path that is not
    there, a hub name while offline, a missing split or a damaged file."""
    try:
        import datasets
    except ImportError:
        raise ModuleNotFoundError(INSTALL_HINT) from None
    if config.path is None:
        raise ValueError("task.dataset.path must name the dataset when task.name is 'dataset'")
    path = Path(config.path).expanduser()
    if path.is_file() and path.suffix.lower() not in FILE_KINDS:
        raise ValueError(f"task.dataset.path: {path} is not a {'/'.join(FILE_KINDS)} file or a saved folder")
    if not path.exists() and not config.online:
        raise ValueError(f"task.dataset.path: {config.path!r} is no local file or folder, and datasets are read "
                         "offline (download it with the datasets library and save_to_disk, or set "
                         "task.dataset.online=true)")
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
        elif path.is_file():
            loaded = datasets.load_dataset(FILE_KINDS[path.suffix.lower()], data_files=str(path), split="train")
        else:
            loaded = datasets.load_dataset(config.path, split=config.split)
    except Exception as e:  # datasets' own errors for a damaged or unreadable file
        raise ValueError(f"task.dataset.path: {config.path} does not read as a dataset: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    table = _split(loaded, config.split, path)
    if config.limit is not None:
        table = table.select(range(min(config.limit, len(table))))
    return table


def _split(loaded, split: str, path: Path):
    if hasattr(loaded, "column_names") and isinstance(loaded.column_names, list):
        return loaded  # a Dataset
    if split not in loaded:
        raise ValueError(f"task.dataset.split: {path} has no split {split!r} (its splits: {sorted(loaded)})")
    return loaded[split]


def load_problems(config: ColumnDatasetConfig) -> list[Problem]:
    """Every row as a Problem (the whole row kept); a column that is not there is one line
    naming the columns that are."""
    table = load_table(config)
    columns = list(table.column_names)
    for field, key in (("prompt_key", config.prompt_key), ("answer_key", config.answer_key)):
        if key is not None and key not in columns:
            raise ValueError(f"task.dataset.{field}: no column {key!r} in {config.path} (its columns: {columns})")
    problems = []
    for index, row in enumerate(table):
        prompt = row[config.prompt_key]
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{config.path} row {index + 1}: column {config.prompt_key!r} holds "
                             f"{type(prompt).__name__} {str(prompt)[:40]!r}, not a non-empty string")
        answer = ""
        if config.answer_key is not None and row[config.answer_key] is not None:
            try:
                answer = reference_answer(str(row[config.answer_key]), config.answer_format)
            except ValueError as e:
                raise ValueError(f"{config.path} row {index + 1}: {e}") from None
        problems.append(Problem(problem_id=index, prompt=prompt, answer=answer, row=row))
    if not problems:
        raise ValueError(f"task.dataset.path: {config.path} holds no rows")
    return problems


class DatasetTask(MathTask):
    """A dataset's problems, drawn without replacement per pass as MathTask draws them; the
    built-in reward is the same final-answer check, against the answer column. dropped:
    prompts left out for being longer than max_prompt_tokens."""

    name = "dataset"

    def __init__(self, problems: list[Problem], *, dropped: int = 0):
        super().__init__(problems)
        self.dropped = dropped

    @classmethod
    def from_config(cls, config: ColumnDatasetConfig,
                    prompt_tokens: Callable[[str], int] | None = None) -> DatasetTask:
        """prompt_tokens(prompt) counts a prompt's tokens as the model will see it."""
        problems = load_problems(config)
        limit = config.max_prompt_tokens
        if limit is None or prompt_tokens is None:
            return cls(problems)
        kept = [p for p in problems if prompt_tokens(p.prompt) <= limit]
        dropped = len(problems) - len(kept)
        if not kept:
            raise ValueError(f"task.dataset.max_prompt_tokens: every one of the {len(problems)} prompts of "
                             f"{config.path} is longer than {limit} tokens")
        if dropped:
            log.warning("task.dataset: dropped %d of %d prompts longer than max_prompt_tokens=%d",
                        dropped, len(problems), limit)
        return cls(kept, dropped=dropped)
