"""Loading GSM8K- and OpenR1-style datasets from JSONL and Parquet files."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlboost.tasks import Task
from rlboost.tasks.dataset import MathDatasetConfig, MathTask, load_math_problems, reference_answer

GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A book costs $1,200. Two cost?", "answer": "2 * 1200 = 2400\n#### 2,400"},
]
OPENR1 = [
    {"problem": "Compute 1/2 + 1/4.", "solution": "We get $\\boxed{\\frac{3}{4}}$.",
     "answer": "\\frac{3}{4}"},
    {"problem": "What is 6 * 7?", "solution": "Clearly \\boxed{42}", "answer": "42"},
]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_gsm8k_jsonl(tmp_path):
    cfg = MathDatasetConfig(path=_jsonl(tmp_path / "gsm8k.jsonl", GSM8K))
    problems = load_math_problems(cfg)
    assert [p.answer for p in problems] == ["7", "2,400"]
    assert problems[0].prompt == "Tom has 3 apples and buys 4 more. How many?"  # the task's template wraps it
    task = MathTask(problems)
    assert isinstance(task, Task)
    assert task.reward(problems[1], "Two books: 2400 dollars.\n#### 2400") == 1.0
    assert task.reward(problems[1], "#### 2300") == 0.0


def test_openr1_parquet_with_boxed_solutions_and_plain_answers(tmp_path):
    path = tmp_path / "openr1.parquet"
    pq.write_table(pa.Table.from_pylist(OPENR1), path)
    boxed = load_math_problems(MathDatasetConfig(
        path=str(path), prompt_field="problem", answer_field="solution", answer_format="boxed"))
    plain = load_math_problems(MathDatasetConfig(
        path=str(path), prompt_field="problem", answer_field="answer", answer_format="plain"))
    assert [p.answer for p in boxed] == [p.answer for p in plain] == ["\\frac{3}{4}", "42"]
    assert MathTask(boxed).reward(boxed[0], "so \\boxed{0.75}") == 1.0


def test_limit_and_auto_format(tmp_path):
    records = GSM8K + [{"question": "q", "answer": "x \\boxed{5}"}, {"question": "q", "answer": "9"}]
    path = _jsonl(tmp_path / "mixed.jsonl", records)
    assert [p.answer for p in load_math_problems(MathDatasetConfig(path=path))] == \
        ["7", "2,400", "5", "9"]
    assert len(load_math_problems(MathDatasetConfig(path=path, limit=3))) == 3


def test_bad_records_are_refused_naming_the_file_and_record(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GSM8K[0]) + "\n{not json\n")
    task = MathTask.from_file(MathDatasetConfig(path=str(path)))
    assert len(task) == 1 and task.refused == {"not JSON": 1}
    path.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="line 1: field 'answer' is missing"):
        load_math_problems(MathDatasetConfig(path=str(path)))
    path.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(ValueError, match="line 1: no '####'"):
        load_math_problems(MathDatasetConfig(path=str(path), answer_format="gsm8k"))
    parquet = tmp_path / "cols.parquet"
    pq.write_table(pa.Table.from_pylist(OPENR1), parquet)
    with pytest.raises(ValueError, match="columns"):
        load_math_problems(MathDatasetConfig(path=str(parquet)))
    with pytest.raises(FileNotFoundError):
        load_math_problems(MathDatasetConfig(path=str(tmp_path / "missing.jsonl")))


def test_reference_answer_formats():
    assert reference_answer("a\n#### 12", "gsm8k") == "12"
    assert reference_answer("so \\boxed{x+1}", "boxed") == "x+1"
    assert reference_answer(" 7 ", "plain") == "7"
    with pytest.raises(ValueError, match="boxed"):
        reference_answer("none", "boxed")


def test_problems_cycle_through_the_dataset_in_seeded_order():
    from rlboost.tasks import Problem
    task = MathTask([Problem(problem_id=i, prompt=f"p{i}", answer=str(i)) for i in range(5)])
    draw = task.problems(12, seed=1)
    assert draw == task.problems(12, seed=1)
    assert sorted(p.problem_id for p in draw[:5]) == list(range(5))  # one full pass first
    assert sorted(p.problem_id for p in draw[5:10]) == list(range(5))


@pytest.mark.parametrize("kwargs,field", [
    ({"answer_format": "latex"}, "answer_format"), ({"path": ""}, "path"),
    ({"limit": 0}, "limit")])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MathDatasetConfig(**{"path": "x.jsonl", **kwargs})
