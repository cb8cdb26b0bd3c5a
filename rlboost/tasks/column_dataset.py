"""DatasetTask: prompts (and reference answers) from any table a user has: a local JSONL,
JSON, Parquet or CSV file, or a folder written by the Hugging Face `datasets` library's
`save_to_disk` (or, online, a hub dataset), with the columns named in the config; every
column of a row reaches the reward function. Files are read record by record within bounds
(record_files); a row that cannot be used (too long, too deep, not UTF-8, no prompt, no
answer, too deep to send to a reward worker) is refused and counted by cause. Prompts
longer than max_prompt_tokens (after the prompt template) are dropped and counted."""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlboost.inputs import MAX_JSON_DEPTH, json_depth
from rlboost.tasks.base import Problem
from rlboost.tasks.dataset import ANSWER_FORMATS, MathTask, reference_answer
from rlboost.tasks.record_files import Record, read_csv, read_json_file, read_json_lines
from rlboost.tasks.refusals import Refusals
from rlboost.validate import require

log = logging.getLogger(__name__)
FILE_KINDS = (".jsonl", ".json", ".parquet", ".csv")
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


def load_rows(config: ColumnDatasetConfig, refusals: Refusals) -> list[Record]:
    """("line 4", row) for every row that reads; ValueError (one line) for a path that is not
    there, a hub name while offline, a missing split or a damaged file."""
    if config.path is None:
        raise ValueError("task.dataset.path must name the dataset when task.name is 'dataset'")
    path = Path(config.path).expanduser()
    kind = path.suffix.lower()
    if path.is_file() and kind not in FILE_KINDS:
        raise ValueError(f"task.dataset.path: {path} is not a {'/'.join(FILE_KINDS)} file or a saved folder")
    if not path.exists() and not config.online:
        raise ValueError(f"task.dataset.path: {config.path!r} is no local file or folder, and datasets are read "
                         "offline (download it with the datasets library and save_to_disk, or set "
                         "task.dataset.online=true)")
    if path.is_file() and kind != ".parquet":
        reader = {".jsonl": read_json_lines, ".json": read_json_file, ".csv": read_csv}[kind]
        return list(reader(path, refusals))
    try:
        if path.is_file():
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        else:
            rows = list(_split(_library_load(config, path), config.split, path))
    except (_OwnError, ModuleNotFoundError):
        raise
    except Exception as e:  # pyarrow's or the datasets library's errors for a damaged or unreadable file
        raise ValueError(f"task.dataset.path: {config.path} does not read as a dataset: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    return [(f"row {i}", row) for i, row in enumerate(rows, 1)]


class _OwnError(ValueError):
    """A refusal of rlboost's own while loading (not the library's error to rephrase)."""


def _library_load(config: ColumnDatasetConfig, path: Path):
    """A folder saved with save_to_disk (or a hub dataset, online), without progress bars."""
    try:
        import datasets
    except ImportError:
        raise ModuleNotFoundError(INSTALL_HINT) from None
    bars = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        return datasets.load_from_disk(str(path)) if path.is_dir() else \
            datasets.load_dataset(config.path, split=config.split)
    finally:
        if bars:
            datasets.utils.logging.enable_progress_bar()


def _split(loaded, split: str, path: Path):
    if hasattr(loaded, "column_names") and isinstance(loaded.column_names, list):
        return loaded  # a Dataset
    if split not in loaded:
        raise _OwnError(f"task.dataset.split: {path} has no split {split!r} (its splits: {sorted(loaded)})")
    return loaded[split]


def load_problems(config: ColumnDatasetConfig, refusals: Refusals | None = None) -> list[Problem]:
    """Every usable row as a Problem (the whole row kept); the others are refused, counted in
    refusals by cause. A column no row has is one line naming the columns there are."""
    refusals = refusals if refusals is not None else Refusals(str(config.path))
    rows = load_rows(config, refusals)
    columns = list(dict.fromkeys(key for _, row in rows for key in row))
    for field, key in (("prompt_key", config.prompt_key), ("answer_key", config.answer_key)):
        if rows and key is not None and key not in columns:
            raise ValueError(f"task.dataset.{field}: no column {key!r} in {config.path} (its columns: {columns})")
    problems = []
    for where, row in rows:
        problem = _problem(config, row, len(problems), refusals, where)
        if problem is not None:
            problems.append(problem)
            if config.limit is not None and len(problems) >= config.limit:
                break
    if not problems:
        raise refusals.nothing_left("rows")
    return problems


def _problem(config: ColumnDatasetConfig, row: dict[str, Any], index: int, refusals: Refusals,
             where: str) -> Problem | None:
    prompt = row.get(config.prompt_key)
    if not isinstance(prompt, str) or not prompt:
        refusals.refuse(where, "not a prompt", f"column {config.prompt_key!r} holds {type(prompt).__name__} "
                                               f"{str(prompt)[:40]!r}, not a non-empty string")
        return None
    answer = ""
    if config.answer_key is not None and row.get(config.answer_key) is not None:
        try:
            answer = reference_answer(str(row[config.answer_key]), config.answer_format)
        except ValueError as e:
            refusals.refuse(where, "no answer", str(e))
            return None
    if json_depth(row, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        refusals.refuse(where, "too deep", f"nested deeper than {MAX_JSON_DEPTH} levels")
        return None
    try:  # what a reward worker will be sent: a row that cannot cross is refused here, not there
        pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        refusals.refuse(where, "unsendable", f"cannot be sent to a reward worker ({type(e).__name__})")
        return None
    return Problem(problem_id=index, prompt=prompt, answer=answer, row=row)


class DatasetTask(MathTask):
    """A dataset's problems, drawn without replacement per pass as MathTask draws them; the
    built-in reward is the same final-answer check, against the answer column. dropped:
    prompts left out for being longer than max_prompt_tokens; refused: rows left out at
    load, by cause."""

    name = "dataset"

    def __init__(self, problems: list[Problem], *, dropped: int = 0, refused: dict[str, int] | None = None):
        super().__init__(problems, refused=refused)
        self.dropped = dropped

    @classmethod
    def from_config(cls, config: ColumnDatasetConfig,
                    prompt_tokens: Callable[[str], int] | None = None) -> DatasetTask:
        """prompt_tokens(prompt) counts a prompt's tokens as the model will see it."""
        refusals = Refusals(str(config.path))
        problems = load_problems(config, refusals)
        limit = config.max_prompt_tokens
        if limit is None or prompt_tokens is None:
            return cls(problems, refused=refusals.as_dict())
        kept = [p for p in problems if prompt_tokens(p.prompt) <= limit]
        dropped = len(problems) - len(kept)
        if not kept:
            raise ValueError(f"task.dataset.max_prompt_tokens: every one of the {len(problems)} prompts of "
                             f"{config.path} is longer than {limit} tokens")
        if dropped:
            log.warning("task.dataset: dropped %d of %d prompts longer than max_prompt_tokens=%d",
                        dropped, len(problems), limit)
        return cls(kept, dropped=dropped, refused=refusals.as_dict())
