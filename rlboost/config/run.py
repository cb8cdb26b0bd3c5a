"""RunConfig: one nested dataclass describing a whole `rlboost train` run.

Its sections are the components' own configs (TrainerConfig, GRPOConfig, ControllerConfig,
TransferConfig, ClusterConfig, CostConfig, ...), held whole, so `--set a.b.c=v` reaches the
component unchanged; RunOptions holds what only a whole run knows (its length, seed,
checkpoints). The checks here are the ones that span sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlboost.cluster.config import ClusterConfig, parse_injection
from rlboost.cluster.cost import CostConfig
from rlboost.controller.config import ControllerConfig
from rlboost.environments.config import EnvironmentConfig
from rlboost.rollout.config import RolloutConfig
from rlboost.tasks.config import TaskConfig
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.starting_weights import ModelSource
from rlboost.transfer.config import TransferConfig, is_loopback
from rlboost.validate import require

TRACKERS = ("tensorboard", "wandb", "mlflow")  # dashboards a run can report to (rlboost.run.trackers)
WANDB_MODES = ("offline", "online")


@dataclass(kw_only=True, slots=True)
class RunOptions:
    """The run as a whole: its length, seed, checkpoints and display.

    seed seeds the driver's `random` and torch generators when the run starts (a resumed
    run restores them from its checkpoint); task.seed, cluster.seed and model.seed seed
    the prompts, the trace's preemptions and the tiny model.
    """

    name: str = "run"
    """the run directory's name starts with this"""
    steps: int = 30
    """GRPO steps to train (a resume trains up to this step)"""
    seed: int = 0
    """seeds the driver's random and torch generators"""
    checkpoint_every: int = 10
    """steps between checkpoints (the last step is always saved)"""
    progress: bool = True
    """show the progress bar and print the summary at the end"""
    microbatch_timeout_s: float = 600.0
    """the trainer gives up waiting for its next micro-batch after this long"""
    max_restarts: int = 3
    """relaunches from the last checkpoint when the controller or a trainer rank dies or a step fails"""
    trackers: tuple[str, ...] = ()
    """dashboards that also get each step's metrics, the config and the plots: tensorboard, wandb, mlflow"""
    wandb_mode: str = "offline"
    """wandb: offline (records in the run directory, `wandb sync` later) or online"""

    def __post_init__(self) -> None:
        require(bool(self.name) and "/" not in self.name, "run.name", "a non-empty name without '/'",
                 self.name)
        require(1 <= self.steps <= 10_000_000, "run.steps", "in [1, 1e7]", self.steps)
        require(self.checkpoint_every >= 1, "run.checkpoint_every", ">= 1", self.checkpoint_every)
        require(self.microbatch_timeout_s > 0, "run.microbatch_timeout_s", "> 0",
                 self.microbatch_timeout_s)
        require(0 <= self.max_restarts <= 1000, "run.max_restarts", "in [0, 1000]", self.max_restarts)
        require(set(self.trackers) <= set(TRACKERS) and len(set(self.trackers)) == len(self.trackers),
                "run.trackers", f"distinct names among {TRACKERS}, e.g. tensorboard,mlflow", self.trackers)
        require(self.wandb_mode in WANDB_MODES, "run.wandb_mode", f"one of {WANDB_MODES}", self.wandb_mode)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything `rlboost train` needs; a recipe returns one, `--set` edits it."""

    model: ModelSource = field(default_factory=ModelSource)
    task: TaskConfig = field(default_factory=TaskConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    run: RunOptions = field(default_factory=RunOptions)

    # --set paths and config.json fields of earlier releases, and where they live now
    renamed_fields: ClassVar[dict[str, str]] = {
        "trainer.lr": "trainer.optimizer.lr",
        "trainer.adam_eps": "trainer.optimizer.eps",
        "trainer.weight_decay": "trainer.optimizer.weight_decay",
        "trainer.max_grad_norm": "trainer.optimizer.max_grad_norm",
        "trainer.param_dtype": "trainer.sharding.param_dtype",
        "trainer.reduce_dtype": "trainer.sharding.reduce_dtype",
        "trainer.gather_bucket_mb": "trainer.sharding.gather_bucket_mb",
        "rollout.policy": "controller.window.policy",
        "controller.registry.max_staleness": "controller.max_staleness",
        "rollout.engine.": "rollout.embedded.",
        "rollout.sglang_tp_size": "rollout.sglang.tp_size",
        "rollout.sglang_mem_fraction": "rollout.sglang.mem_fraction_static",
        "rollout.emulated_preemptible_speed": "rollout.emulated.preemptible_speed",
        "task.math_path": "task.math.path",
        "task.math_prompt_field": "task.math.prompt_field",
        "task.math_answer_field": "task.math.answer_field",
        "task.math_answer_format": "task.math.answer_format",
        "transfer.port": "transfer.publisher.port",
        "transfer.relay_port": "transfer.relay_server.port",
        "transfer.egress_bytes_per_s": "transfer.publisher.egress_bytes_per_s",
        "transfer.versions_kept": "transfer.publisher.versions_kept",
        "transfer.max_connections": "transfer.publisher.max_connections",
        "transfer.max_handshakes": "transfer.publisher.max_handshakes",
    }

    def __post_init__(self) -> None:
        check_rollout(self)
        for item in self.cluster.inject:
            _, step = parse_injection(item)
            require(step <= self.run.steps, "cluster.inject", f"steps within run.steps={self.run.steps}", item)
        if self.cluster.address:
            check_multi_node(self)
        # an episode's next turn is queued on the running step's router; steps started ahead
        # have routers of their own, which the episode driver does not feed yet
        require(not (self.environment.multi_turn and self.controller.max_staleness), "controller.max_staleness",
                "0 with a multi-turn environment (environment.name)", self.controller.max_staleness)


def check_rollout(config: RunConfig) -> None:
    """The engines run where the trainer does."""
    if config.trainer.device == "cuda" and not config.rollout.on_gpu and config.rollout.backend != "emulated":
        raise ValueError("rollout.embedded.device must be a CUDA device when trainer.device is 'cuda'")


_JOINS = "the run joins a Ray cluster (cluster.address or RLBOOST_RAY_ADDRESS)"


def check_multi_node(config: RunConfig) -> None:
    """A run that joins a Ray cluster (cluster.address here, or RLBOOST_RAY_ADDRESS when the
    run starts) spans machines: its weight servers must listen where other nodes reach them,
    and a file rendezvous needs a folder every trainer node sees. (The run's secret reaches
    its processes on every machine through Ray.)"""
    t = config.transfer
    if is_loopback(t.bind_host):
        raise ValueError(f"transfer.bind_host must be an address other nodes reach (e.g. 0.0.0.0) when "
                         f"{_JOINS}, got {t.bind_host!r}")
    if config.trainer.rendezvous == "file" and not config.trainer.rendezvous_dir:
        raise ValueError("trainer.rendezvous_dir must name a folder every trainer node sees (a shared "
                         f"file system) when trainer.rendezvous is 'file' and {_JOINS}; or set "
                         "trainer.rendezvous=tcp")

