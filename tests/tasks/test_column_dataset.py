"""task.name=dataset: any table through the datasets library, by column: JSONL, Parquet,
CSV and a folder saved with save_to_disk; every column reaches the reward; a column that is
not there, or a hub name while offline, is one line; long prompts are dropped and counted."""

from __future__ import annotations

import json

import pytest

from rlboost.tasks.column_dataset import ColumnDatasetConfig, DatasetTask, load_problems

datasets = pytest.importorskip("datasets")

ROWS = [{"question": f"{a}+{b}=", "solution": str(a + b), "level": a % 3} for a in range(6) for b in range(4)]


def write(tmp_path, kind: str):
    table = datasets.Dataset.from_list(ROWS)
    if kind == "jsonl":
        path = tmp_path / "sums.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "parquet":
        path = tmp_path / "sums.parquet"
        table.to_parquet(str(path))
    elif kind == "csv":
        path = tmp_path / "sums.csv"
        table.to_csv(str(path), index=False)
    elif kind == "saved":
        path = tmp_path / "sums-saved"
        table.save_to_disk(str(path))
    else:  # a DatasetDict saved with its splits
        path = tmp_path / "sums-dict"
        datasets.DatasetDict({"train": table, "test": table.select(range(3))}).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "csv", "saved", "dict"])
def test_every_source_reads_by_column_and_keeps_the_row(tmp_path, kind):
    config = ColumnDatasetConfig(path=str(write(tmp_path, kind)), prompt_key="question", answer_key="solution")
    problems = load_problems(config)
    assert len(problems) == len(ROWS)
    assert [(p.prompt, p.answer) for p in problems[:2]] == [("0+0=", "0"), ("0+1=", "1")]
    assert problems[5].row["level"] == 1 and set(problems[5].row) == {"question", "solution", "level"}
    if kind == "dict":
        test = load_problems(ColumnDatasetConfig(path=config.path, split="test", prompt_key="question",
                                                 answer_key="solution"))
        assert len(test) == 3


def test_a_wrong_column_names_the_columns_there_are(tmp_path):
    path = write(tmp_path, "parquet")
    with pytest.raises(ValueError) as err:
        load_problems(ColumnDatasetConfig(path=str(path), prompt_key="prompt", answer_key="solution"))
    assert str(err.value) == (f"task.dataset.prompt_key: no column 'prompt' in {path} "
                              "(its columns: ['question', 'solution', 'level'])")
    with pytest.raises(ValueError, match="answer_key: no column 'answer'"):
        load_problems(ColumnDatasetConfig(path=str(path), prompt_key="question"))
    with pytest.raises(ValueError, match=r"has no split 'validation' \(its splits: \['test', 'train'\]\)"):
        load_problems(ColumnDatasetConfig(path=str(write(tmp_path, "dict")), split="validation",
                                          prompt_key="question", answer_key="solution"))


def test_a_hub_name_offline_is_one_line():
    with pytest.raises(ValueError) as err:
        load_problems(ColumnDatasetConfig(path="openai/gsm8k", prompt_key="question"))
    assert "no local file or folder, and datasets are read offline" in str(err.value)
    assert "task.dataset.online=true" in str(err.value) and "\n" not in str(err.value)


def test_a_damaged_file_is_one_line(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match="does not read as a dataset"):
        load_problems(ColumnDatasetConfig(path=str(path), prompt_key="question"))


def test_long_prompts_are_dropped_and_counted(tmp_path):
    rows = [{"question": "x" * n, "solution": "1"} for n in (3, 10, 4, 30)]
    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ColumnDatasetConfig(path=str(path), prompt_key="question", answer_key="solution", max_prompt_tokens=6)
    task = DatasetTask.from_config(config, prompt_tokens=lambda prompt: len(prompt) + 2)  # template adds 2
    assert task.dropped == 2 and len(task) == 2
    assert {p.prompt for p in task.problems(4, seed=0)} == {"xxx", "xxxx"}
    with pytest.raises(ValueError, match="every one of the 4 prompts"):
        DatasetTask.from_config(ColumnDatasetConfig(path=str(path), prompt_key="question", answer_key=None,
                                                    max_prompt_tokens=1),
                                prompt_tokens=len)
