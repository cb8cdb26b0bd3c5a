"""Data set readers bound what one record may hold: its length, its nesting and its
encoding. A record past a bound is refused (left out, counted by cause, its first of each
cause logged in one line naming the file and the record), and the rest load; a file with
nothing readable is one line naming the file, the record and the cause, never the datasets
library's generic error or a traceback of Python's parser."""

from __future__ import annotations

import json
import logging

import pytest

from rlboost.tasks.dataset import MathDatasetConfig, MathTask, load_math_problems

GOOD = {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"}


def _hostile_lines() -> list[bytes]:
    return [b"[" * 100_000 + b"]" * 100_000,                          # nested 100k deep
            json.dumps({"question": _nest(200), "answer": "#### 1"}).encode(),  # deeper than the bound
            b'{"question": "caf\xe9?", "answer": "#### 2"}',            # not UTF-8
            json.dumps({"question": "x" * (10 << 20), "answer": "#### 3"}).encode(),  # a 10 MB line
            b'{"question": "truncated',                                 # not JSON
            b"[1, 2, 3]"]                                               # not an object


def _nest(levels: int) -> object:
    value: object = "q"
    for _ in range(levels):
        value = [value]
    return value


def test_hostile_jsonl_records_are_refused_by_cause_and_the_rest_load(tmp_path, caplog):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join([json.dumps(GOOD).encode(), *_hostile_lines(), json.dumps(GOOD).encode()]) + b"\n")
    with caplog.at_level(logging.WARNING):
        task = MathTask.from_file(MathDatasetConfig(path=str(path)))
    assert len(task) == 2
    assert task.refused == {"too deep": 2, "not UTF-8": 1, "too long": 1, "not JSON": 1, "not an object": 1}
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"{path} line 2" in said and f"{path} line 4" in said and f"{path} line 5" in said
    assert all("\n" not in r.getMessage() for r in caplog.records)


def test_a_file_with_nothing_readable_is_one_line_naming_the_record_and_cause(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(ValueError) as err:
        load_math_problems(MathDatasetConfig(path=str(path)))
    assert f"{path} line 1" in str(err.value) and "deeper than" in str(err.value) and "\n" not in str(err.value)
    path.write_bytes(b'{"question": "\xff\xfe", "answer": "#### 1"}\n')
    with pytest.raises(ValueError, match="line 1: not UTF-8"):
        load_math_problems(MathDatasetConfig(path=str(path)))
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="holds no records"):
        load_math_problems(MathDatasetConfig(path=str(empty)))


def test_a_long_line_is_not_read_whole(tmp_path):
    path = tmp_path / "long.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"question": "' + b"y" * (64 << 20) + b'", "answer": "#### 1"}\n')
        f.write(json.dumps(GOOD).encode() + b"\n")
    import tracemalloc

    tracemalloc.start()
    task = MathTask.from_file(MathDatasetConfig(path=str(path)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(task) == 1 and task.refused == {"too long": 1}
    assert peak < 32 << 20  # the 64 MiB line was skipped in pieces, never held


datasets = pytest.importorskip("datasets")


@pytest.mark.parametrize("kind,content,says", [
    ("jsonl", b"", "holds no rows"),
    ("csv", b"", "holds no rows"),
    ("jsonl", b'\n{"question": "2+', "line 2: not JSON"),
    ("csv", b"question,solution\n\"1+1=,2\n", "line 2"),
    ("csv", b"question,solution\n1+1=,2,extra,more\n", "line 2: 4 fields, the header has 2"),
    ("jsonl", b"\x00\x01garbage\xff\n", "line 1: not UTF-8"),
])
def test_column_datasets_name_the_file_line_and_cause(tmp_path, capfd, kind, content, says):
    from rlboost.tasks.column_dataset import ColumnDatasetConfig, load_problems

    path = tmp_path / f"data.{kind}"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        load_problems(ColumnDatasetConfig(path=str(path), prompt_key="question", answer_key="solution"))
    assert str(path) in str(err.value) and says in str(err.value), str(err.value)
    assert "\n" not in str(err.value) and "DatasetGenerationError" not in str(err.value)
    out = capfd.readouterr()
    assert "Generating" not in out.err + out.out  # no progress bar around a refusal


def test_column_dataset_rows_refused_are_counted_and_deep_rows_never_reach_a_worker(tmp_path):
    from rlboost.tasks.column_dataset import ColumnDatasetConfig, DatasetTask

    path = tmp_path / "rows.jsonl"
    rows = [json.dumps({"question": "1+1=", "solution": "2", "meta": {"k": 1}}).encode(),
            json.dumps({"question": "2+2=", "solution": "4", "meta": _nest(200)}).encode(),
            b'{"question": "3+3=", "solution": "6", "meta": "\xc3\x28"}',
            json.dumps({"question": 5, "solution": "5"}).encode()]
    path.write_bytes(b"\n".join(rows) + b"\n")
    task = DatasetTask.from_config(ColumnDatasetConfig(path=str(path), prompt_key="question", answer_key="solution"))
    assert len(task) == 1 and task.problems(1, seed=0)[0].row["meta"] == {"k": 1}
    assert task.refused == {"too deep": 1, "not UTF-8": 1, "not a prompt": 1}


def test_csv_rows_keep_their_numbers(tmp_path):
    from rlboost.tasks.column_dataset import ColumnDatasetConfig, load_problems

    path = tmp_path / "sums.csv"
    path.write_text('question,solution,level,weight\n"1+1=",2,1,0.5\n"a, b",x,2,\n')
    problems = load_problems(ColumnDatasetConfig(path=str(path), prompt_key="question", answer_key="solution"))
    assert problems[0].row == {"question": "1+1=", "solution": "2", "level": 1, "weight": 0.5}
    assert problems[1].row["question"] == "a, b" and problems[1].row["weight"] is None
