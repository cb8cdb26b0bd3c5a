"""`rlboost train --set task.name=dataset`: a Parquet file, and a folder saved with the
datasets library, each feed a run through column mapping. The Parquet run also reports to
every dashboard whose package is installed: TensorBoard's event files hold the reward and
throughput of every step (read back with TensorBoard's own reader), W&B (offline) and MLflow
(local store) write their records in the run directory."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

ROWS = [{"q": f"{a}+{b}=", "sum": str(a + b), "level": a // 5} for a in range(10) for b in range(10)]
RUN = ["--set", "run.progress=false", "--set", "model.warmup_steps=0", "--set", "task.name=dataset",
       "--set", "task.dataset.prompt_key=q", "--set", "task.dataset.answer_key=sum",
       "--set", "task.groups_per_step=8", "--set", "task.group_size=4", "--set", "trainer.microbatch_groups=4",
       "--set", "rollout.capacity=8", "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=0",
       "--set", "cluster.initial_preemptible=0"]
REWARD = '''
def score(prompt, completion, row, metadata):
    assert set(row) == {"q", "sum", "level"} and prompt == row["q"], row  # every column comes through
    return {"score": float(completion.strip() == row["sum"]), "level": row["level"]}
'''


def _train(tmp_path: Path, *args: str) -> Path:
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *RUN, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _installed(*names: str) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is not None]


@pytest.mark.timeout(900)  # a whole run; on a loaded 2-core machine it has taken 7 minutes
def test_a_parquet_file_feeds_a_run_that_reports_to_every_dashboard(tmp_path):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "sums.parquet"))
    trackers = _installed("tensorboard", "wandb", "mlflow")
    run = _train(tmp_path, "--set", "task.dataset.path=sums.parquet", "--set", "run.steps=2",
                 *(["--set", "run.trackers=" + ",".join(trackers)] if trackers else []))
    metrics = _metrics(run)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["samples_trained"] == 32 for m in metrics)
    assert all(m["reward_failures"] == 0 and m["prompts_dropped"] == 0 for m in metrics)
    if "tensorboard" in trackers:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
        for tag, key in (("reward_mean", "reward_mean"), ("tokens_per_s", "tokens_per_s")):
            logged = {e.step: e.value for e in events.Scalars(tag)}  # float32
            assert logged == pytest.approx({m["step"]: m[key] for m in metrics}, rel=1e-6)
        assert "plots/reward_throughput" in events.Tags()["images"]
    if "wandb" in trackers:
        (offline,) = (run / "wandb").glob("offline-run-*")
        assert list(offline.glob("run-*.wandb"))
    if "mlflow" in trackers:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
        (logged,) = client.search_runs([client.get_experiment_by_name("rlboost").experiment_id])
        steps = [m.step for m in client.get_metric_history(logged.info.run_id, "reward_mean")]
        assert sorted(steps) == [1, 2]
        assert (run / "mlartifacts" / logged.info.run_id / "artifacts" / "plots" / "reward_throughput.png").is_file()


@pytest.mark.timeout(900)  # a whole run; on a loaded 2-core machine it has taken 7 minutes
def test_a_saved_datasets_folder_feeds_a_run_scored_by_a_function_in_a_file(tmp_path):
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "sums"))
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "reward.py").write_text(REWARD)
    run = _train(tmp_path, "--set", "task.dataset.path=sums", "--set", "run.steps=1",
                 "--set", "task.reward=checks/reward.py:score", "--set", "task.dataset.max_prompt_tokens=5")
    (m,) = _metrics(run)
    assert m["samples_trained"] == 32 and m["reward_failures"] == 0
    assert 0.0 <= m["reward_parts"]["level"] <= 1.0
    # BOS + "a+b=": 5 tokens for one-digit sums, all of them kept (the 2-digit ones are not in ROWS)
    assert m["prompts_dropped"] == 0
