"""run.trackers: each dashboard gets every step's numbers as metrics.jsonl has them, the
config and the plots, in the run directory; a tracker whose package is missing is one line
before anything runs. (tests/tasks/test_own_task_run.py checks them under a real run.)"""

from __future__ import annotations

import importlib.util
import json

import matplotlib
import pytest

from rlboost.config.run import RunOptions
from rlboost.errors import ConfigError
from rlboost.run import trackers as trackers_module
from rlboost.run.trackers import check_trackers, open_trackers, scalars

matplotlib.use("Agg")
STEPS = [{"step": s, "reward_mean": 0.1 * s, "tokens_per_s": 100.0 + s, "reward_parts": {"format": 0.5},
          "reward_failures_by_kind": {"timeout": s}, "example_prompt": "1+2=", "sample_versions": [s],
          "reward_std": float("nan")} for s in (1, 2, 3)]
CONFIG = {"run": {"name": "t", "steps": 3}, "task": {"reward": "my:score"}}


def _plot(tmp_path):
    import matplotlib.pyplot as plt

    plots = tmp_path / "plots"
    plots.mkdir()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2, 3])
    fig.savefig(plots / "reward_throughput.png")
    plt.close(fig)
    return plots


def _run(tmp_path, name):
    plots = _plot(tmp_path)
    trackers = open_trackers([name], tmp_path, CONFIG)
    for record in STEPS:
        trackers.log_step(record)
    trackers.finish(plots)


def test_scalars_are_the_finite_numbers_flattened():
    assert scalars(STEPS[0]) == {"reward_mean": 0.1, "tokens_per_s": 101.0, "reward_parts/format": 0.5,
                                 "reward_failures_by_kind/timeout": 1.0}


def test_tensorboard_gets_every_step_the_config_and_the_plots(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(tmp_path, "tensorboard")
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0, "tensors": 0}).Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("reward_mean")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [e.value for e in events.Scalars("reward_failures_by_kind/timeout")] == [1.0, 2.0, 3.0]
    assert "plots/reward_throughput" in events.Tags()["images"]
    (text,) = events.Tensors("config/text_summary")
    assert "my:score" in text.tensor_proto.string_val[0].decode()


def test_wandb_offline_writes_its_run_record(tmp_path):
    pytest.importorskip("wandb")
    _run(tmp_path, "wandb")
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    (record,) = offline.glob("run-*.wandb")
    data = record.read_bytes()  # W&B's own protobuf log: the config, then every step's values
    assert b"my:score" in data and b"reward_mean" in data and b"reward_failures_by_kind/timeout" in data


def test_mlflow_writes_a_local_store(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    _run(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("rlboost").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "tokens_per_s")] == \
        [(1, 101.0), (2, 102.0), (3, 103.0)]
    artifacts = tmp_path / "mlartifacts" / run.info.run_id / "artifacts"
    assert json.loads((artifacts / "config.json").read_text()) == CONFIG
    assert (artifacts / "plots" / "reward_throughput.png").is_file()


def test_a_tracker_without_its_package_is_one_line(monkeypatch):
    monkeypatch.setitem(trackers_module.PACKAGES, "wandb", "no_such_wandb_package")
    with pytest.raises(ConfigError) as err:
        check_trackers(["tensorboard", "wandb"] if importlib.util.find_spec("tensorboard") else ["wandb"])
    assert str(err.value) == ("run.trackers: wandb needs the no_such_wandb_package package: pip install "
                              "'rlboost[wandb]' (or leave wandb out of run.trackers)")


def test_tracker_names_are_checked_with_the_config():
    assert RunOptions(trackers=("tensorboard", "mlflow")).trackers == ("tensorboard", "mlflow")
    for bad in (("neptune",), ("wandb", "wandb")):
        with pytest.raises(ValueError, match="run.trackers must be distinct names"):
            RunOptions(trackers=bad)


def test_a_run_checks_its_trackers_before_anything_starts(monkeypatch):
    from rlboost.config.run import RunConfig
    from rlboost.run.job import preflight

    monkeypatch.setitem(trackers_module.PACKAGES, "mlflow", "no_such_mlflow_package")
    with pytest.raises(ConfigError, match="run.trackers: mlflow needs the no_such_mlflow_package package"):
        preflight(RunConfig(run=RunOptions(trackers=("mlflow",))))
