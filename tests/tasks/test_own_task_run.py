"""`rlboost train` on a user's own task, as one run read by several tests: prompts from a
folder saved with the datasets library (column mapping, every column handed to the reward),
a reward function from the user's own module (outside the package) that returns a dict of
named parts, raises on 10% of samples and sleeps past the timeout on 5%, and every dashboard
whose package is installed. The run completes; the failures are counted per step in
metrics.jsonl and in the summary; TensorBoard's event files hold the reward and throughput
of every step (read back with TensorBoard's own reader), W&B (offline) and MLflow (local
store) write their records in the run directory. Parquet, JSONL and CSV files go through the
same reader (tests/tasks/test_column_dataset.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

ROWS = [{"q": f"{a}+{b}=", "sum": str(a + b), "level": a // 5} for a in range(10) for b in range(10)]
STEPS, GROUPS, GROUP_SIZE = 2, 10, 4
USER_MODULE = textwrap.dedent('''
    """A user's reward: correct answers earn 1, a clean number 0.1 more. Of every 20 samples
    of a step (by their place in it) 2 raise and 1 hangs. Each call notes what it did first."""
    import json, os, time

    LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl")

    def score(prompt, completion, row, metadata):
        sid = metadata["sample_id"]
        place = (metadata["group_id"] % 100000) * 4 + sid % 65536  # group in the step, sample in the group
        fate = {0: "raise", 1: "raise", 2: "hang"}.get(place % 20, "ok")
        with open(LOG, "a") as f:
            f.write(json.dumps({"step": metadata["step"], "sample_id": sid, "fate": fate}) + "\\n")
        assert set(row) == {"q", "sum", "level"} and prompt == row["q"], row  # every column comes through
        if fate == "raise":
            raise RuntimeError(f"verifier crashed on sample {sid}")
        if fate == "hang":
            time.sleep(60)
        text = completion.strip()
        correct = float(metadata["finish_reason"] == "stop" and text == row["sum"])
        return {"score": correct + 0.1 * float(text.isdigit()), "correct": correct, "level": row["level"]}
''')
RUN = ["--set", f"run.steps={STEPS}", "--set", "run.progress=false",  # the tiny model warms up on the data set
       "--set", "task.name=dataset", "--set", "task.dataset.path=sums", "--set", "task.dataset.prompt_key=q",
       "--set", "task.dataset.answer_key=sum", "--set", "task.dataset.max_prompt_tokens=5",
       "--set", f"task.groups_per_step={GROUPS}", "--set", f"task.group_size={GROUP_SIZE}",
       "--set", "task.reward=my_rewards:score", "--set", "task.reward_timeout_s=2", "--set", "task.reward_workers=2",
       "--set", "trainer.microbatch_groups=2", "--set", "rollout.capacity=8", "--set", "cluster.trace=none",
       "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1",
       "--set", "trainer.world_size=1"]  # one trainer rank: nothing here depends on the rank count (two ranks: test_train_cli, test_supervision)
TRACKERS = ("tensorboard", "wandb", "mlflow")  # the test extra installs all three


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def own_task(tmp_path_factory) -> tuple[Path, Path]:
    """The run (each whole run spends most of its time starting Ray and its processes):
    its folder (the user's files) and its run directory."""
    base = tmp_path_factory.mktemp("own-task")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(base / "sums"))
    (base / "my_rewards.py").write_text(USER_MODULE)
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(base / "runs"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    # cwd: the user's folder, where the reward module and the dataset are
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *RUN, "--set", "run.trackers=" + ",".join(TRACKERS)], cwd=base, env=env,
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return base, Path(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(900)  # a whole run; on a loaded 2-core machine one has taken 7 minutes
def test_a_saved_datasets_folder_feeds_a_run_with_every_column(own_task):
    _, run = own_task
    metrics = _jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:
        assert m["samples_trained"] == GROUPS * GROUP_SIZE
        # BOS + "a+b=": 5 tokens for one-digit operands, all of them kept
        assert m["prompts_dropped"] == 0
        # the function's own assertion on the row's columns never failed
        assert "AssertionError" not in m.get("reward_failures_by_kind", {})
        assert 0.0 <= m["reward_parts"]["level"] <= 1.0
    # warmed up on the data set's own answers, the tiny model answers some prompts right from step 1
    assert metrics[0]["reward_parts"]["correct"] > 0.0


@pytest.mark.timeout(900)
def test_a_reward_function_that_raises_and_hangs_scores_those_samples_zero_and_the_run_goes_on(own_task):
    base, run = own_task
    metrics = _jsonl(run / "metrics.jsonl")
    calls = _jsonl(base / "calls.jsonl")
    fates = Counter(c["fate"] for c in calls)
    n = STEPS * GROUPS * GROUP_SIZE
    assert (fates["raise"], fates["hang"], len(calls)) == (n // 10, n // 20, n)  # 10% raise, 5% hang
    total = 0
    for m in metrics:
        step_fates = Counter(c["fate"] for c in calls if c["step"] == m["step"])
        assert sum(step_fates.values()) == m["samples_trained"]  # every sample scored once
        want = {k: c for k, c in (("RuntimeError", step_fates["raise"]), ("timeout", step_fates["hang"])) if c}
        assert m["reward_failures_by_kind"] == want
        assert m["reward_failures"] == step_fates["raise"] + step_fates["hang"]
        assert set(m["reward_parts"]) == {"correct", "level"}
        assert all(0.0 <= v <= 1.0 for v in m["reward_parts"].values())
        total += m["reward_failures"]
    first = {k: v for m in metrics for k, v in m.get("reward_errors", {}).items()}
    assert "verifier crashed on sample" in first["RuntimeError"] and "reward_timeout_s=2" in first["timeout"]
    summary = (run / "summary.md").read_text()
    assert f"| reward failures (scored 0) | {total} (" in summary
    assert "RuntimeError" in summary and "timeout" in summary


@pytest.mark.timeout(900)
def test_the_run_reports_to_every_dashboard(own_task):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run = own_task
    metrics = _jsonl(run / "metrics.jsonl")
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
    for tag in ("reward_mean", "tokens_per_s"):
        logged = {e.step: e.value for e in events.Scalars(tag)}  # float32
        assert logged == pytest.approx({m["step"]: m[tag] for m in metrics}, rel=1e-6)
    assert "plots/reward_throughput" in events.Tags()["images"]
    (offline,) = (run / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb"))
    client = MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    (logged,) = client.search_runs([client.get_experiment_by_name("rlboost").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(logged.info.run_id, "reward_mean")) == [m["step"] for m in metrics]
    assert (run / "mlartifacts" / logged.info.run_id / "artifacts" / "plots" / "reward_throughput.png").is_file()
