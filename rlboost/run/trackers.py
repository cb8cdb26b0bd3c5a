"""Dashboards a run reports to besides metrics.jsonl (`run.trackers`): TensorBoard event
files, a Weights & Biases run (offline by default: synced later with `wandb sync`) and an
MLflow run in a local store, all under the run directory. Each gets every step's numbers as
metrics.jsonl has them (nested ones flattened as "a/b"), the run's config, and the plots
as images at the end. One interface, one class per dashboard; a missing package is one
line before anything runs (check_trackers)."""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any, Iterable, Protocol

from rlboost.config.run import TRACKERS
from rlboost.errors import ConfigError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


class Tracker(Protocol):
    def log_step(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_images(self, images: list[Path]) -> None: ...

    def close(self) -> None: ...


def check_trackers(names: Iterable[str]) -> None:
    """ConfigError naming the first tracker whose package is not installed."""
    for name in names:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(f"run.trackers: {name} needs the {PACKAGES[name]} package: "
                              f"pip install 'rlboost[{name}]' (or leave {name} out of run.trackers)")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics line, nested mappings flattened ("reward_parts/format").

    >>> scalars({"step": 3, "reward_mean": 0.5, "reward_parts": {"format": 1.0}, "example_prompt": "1+2="})
    {'reward_mean': 0.5, 'reward_parts/format': 1.0}
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step":
            continue
        if isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in scalars({str(k): v for k, v in value.items()}).items()})
        elif isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return out


class Trackers:
    """The run's trackers together: log_step(record) after each metrics line, finish(plots)
    at the end (images, then close)."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def log_step(self, record: dict[str, Any]) -> None:
        flat = scalars(record)
        for tracker in self.trackers:
            tracker.log_step(int(record["step"]), flat)

    def finish(self, plots_dir: Path) -> None:
        images = sorted(plots_dir.glob("*.png"))
        for tracker in self.trackers:
            try:
                tracker.log_images(images)
            finally:
                tracker.close()


def open_trackers(names: Iterable[str], run_dir: Path, config: dict[str, Any], *, wandb_mode: str = "offline"
                  ) -> Trackers:
    """One tracker per name, writing under run_dir, each given the config."""
    makers = {"tensorboard": TensorBoardTracker, "wandb": lambda d, c: WandbTracker(d, c, mode=wandb_mode),
              "mlflow": MlflowTracker}
    return Trackers([makers[name](run_dir, config) for name in names])


class TensorBoardTracker:
    """Event files in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard`)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, sort_keys=True) + "\n```")

    def log_step(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_images(self, images: list[Path]) -> None:
        import matplotlib.image

        for path in images:
            self.writer.add_image(f"plots/{path.stem}", matplotlib.image.imread(path)[..., :3], dataformats="HWC")

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run in RUN_DIR/wandb; offline unless mode is "online"."""

    def __init__(self, run_dir: Path, config: dict[str, Any], *, mode: str = "offline"):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project="rlboost", name=run_dir.name, dir=str(run_dir), mode=mode, config=config,
                              settings=wandb.Settings(silent=True, console="off"))

    def log_step(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_images(self, images: list[Path]) -> None:
        if images:
            self.run.log({f"plots/{p.stem}": self.wandb.Image(str(p)) for p in images})

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # wait for W&B's service to write out the run's record


class MlflowTracker:
    """An MLflow run in a local store: RUN_DIR/mlflow.db (SQLite, MLflow's local backend),
    artifacts in RUN_DIR/mlartifacts (`mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve()}/mlflow.db")
        found = self.client.get_experiment_by_name("rlboost")  # a resumed run's store has it
        experiment = found.experiment_id if found is not None else self.client.create_experiment(
            "rlboost", artifact_location=(run_dir / "mlartifacts").resolve().as_uri())
        self.run_id = self.client.create_run(experiment, run_name=run_dir.name).info.run_id
        self.client.log_dict(self.run_id, config, "config.json")

    def log_step(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def log_images(self, images: list[Path]) -> None:
        for path in images:
            self.client.log_artifact(self.run_id, str(path), "plots")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _mlflow_key(key: str) -> str:
    # MLflow keys allow letters, digits, _ - . space / only
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key)


__all__ = ["TRACKERS", "Trackers", "check_trackers", "open_trackers", "scalars"]
