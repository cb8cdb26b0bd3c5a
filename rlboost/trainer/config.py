"""TrainerConfig: the FSDP2 trainer group of a run, holding its sharding and optimizer
configs whole, so `--set trainer.optimizer.lr=...` reaches the optimizer unchanged. The
configs import no torch: reading or checking a run's config loads no FSDP."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.timing import ACCELERATORS
from rlboost.validate import require

DEVICES = ("cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
RENDEZVOUS = ("file", "tcp")
DTYPES = ("float32", "float16", "bfloat16")  # dtype names a config may use
GRAD_REDUCTIONS = ("sum", "mean")


@dataclass(kw_only=True, slots=True)
class FSDPConfig:
    """How the trainer shards its model.

    param_dtype / reduce_dtype: compute and gradient-reduction dtypes (None keeps the
    parameters' own dtype; sharded master weights stay in their stored dtype).
    grad_reduction "sum" adds the ranks' gradients, so a loss normalised by the whole
    step's token count (grpo.aggregate's denominator, which batch.micro_batch_loss
    requires under a process group) gives the exact full-batch gradient however samples
    are spread over ranks and micro-batches; "mean" is FSDP's default average (then the
    gradient is 1/world of the full-batch one).
    gather_bucket_mb bounds the extra memory of one full-weight gather step.
    """

    param_dtype: str | None = None
    """compute dtype of sharded parameters (bfloat16, float16, float32; None: their own)"""
    reduce_dtype: str | None = None
    """dtype in which gradients are reduced across ranks (None: the compute dtype)"""
    reshard_after_forward: bool = True
    """free each block's gathered weights after its forward (less memory, one more gather)"""
    grad_reduction: str = "sum"
    """how ranks' gradients combine: sum (exact full-batch gradient) or mean (FSDP's default)"""
    gather_bucket_mb: int = 64
    """MiB of full weights gathered at once when publishing or checkpointing"""

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(f"{name} must be None or one of {tuple(DTYPES)}, got {value!r}")
        if self.grad_reduction not in GRAD_REDUCTIONS:
            raise ValueError(f"grad_reduction must be one of {GRAD_REDUCTIONS}, "
                             f"got {self.grad_reduction!r}")
        if self.gather_bucket_mb < 1:
            raise ValueError(f"gather_bucket_mb must be >= 1, got {self.gather_bucket_mb}")

    @property
    def gather_bucket_bytes(self) -> int:
        return self.gather_bucket_mb << 20


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """AdamW settings; max_grad_norm None disables clipping. offload moves the optimizer's
    whole state (fp32 shards, gradients, moments) to host memory: about 16 bytes per
    parameter over the ranks leave the GPU, for a host-side step and copies each step."""

    lr: float = 1e-5
    """AdamW learning rate, in (0, 1)"""
    beta1: float = 0.9
    """AdamW first-moment decay"""
    beta2: float = 0.999
    """AdamW second-moment decay"""
    eps: float = 1e-8
    """AdamW epsilon"""
    weight_decay: float = 0.0
    """decoupled weight decay"""
    max_grad_norm: float | None = 1.0
    """clip the global gradient norm to this (None: no clipping)"""
    offload: bool = False
    """keep the parameter shards, their gradients and AdamW's state in host memory (FSDP2's CPUOffloadPolicy; the step runs on the CPU)"""

    def __post_init__(self) -> None:
        if not 0.0 < self.lr < 1.0:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0.0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if not self.weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm must be None or > 0, got {self.max_grad_norm}")


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    """The trainer group: ranks, devices, how they meet, and how micro-batches are cut.

    microbatch_groups complete prompt groups make one micro-batch (the last one of a step
    may hold fewer), whose advantages are computed then; every micro-batch is split across
    the world_size ranks, and each rank's share into forwards of at most
    max_tokens_per_micro_batch tokens (packed without padding when packing is on), so a
    forward may hold part of a group. gpu names the accelerator the ranks run on (a key of
    rlboost.timing.ACCELERATORS), against whose memory a GPU run's memory plan is checked.

    >>> TrainerConfig(world_size=4, optimizer=OptimizerConfig(lr=1e-6)).optimizer.lr
    1e-06
    """

    world_size: int = 2
    """number of FSDP2 ranks (one Ray actor each)"""
    device: str = "cpu"
    """where the ranks compute: cpu or cuda"""
    backend: str = "auto"
    """torch.distributed backend: auto (gloo on cpu, nccl on cuda), gloo or nccl"""
    rendezvous: str = "file"
    """how ranks meet: file (a file in rendezvous_dir) or tcp (rank 0's address)"""
    rendezvous_dir: str | None = None
    """folder of the file rendezvous, seen by every trainer node (None: the run directory)"""
    microbatch_groups: int = 16
    """complete prompt groups per micro-batch"""
    max_tokens_per_micro_batch: int | None = None
    """tokens per forward on each rank, padding included (None: a rank's whole share of a micro-batch at once); a longer sample goes alone"""
    packing: bool = True
    """lay a forward's samples end to end without padding (attention stays inside each sample)"""
    activation_checkpointing: bool = False
    """recompute each decoder layer's activations in backward instead of keeping them"""
    gpu: str = "h100-sxm"
    """the GPU kind the ranks run on, for the memory plan: h100-sxm, h200, a100-sxm-80gb"""
    rank_cpus: float = 0.0
    """CPUs each rank asks Ray for"""
    rank_gpus: float = 0.0
    """GPUs each rank asks Ray for (> 0 when device is cuda)"""
    sharding: FSDPConfig = field(default_factory=FSDPConfig)
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-3))

    def __post_init__(self) -> None:
        require(1 <= self.world_size <= 1024, "world_size", "in [1, 1024]", self.world_size)
        require(self.device in DEVICES, "device", f"one of {DEVICES}", self.device)
        require(self.backend in BACKENDS, "backend", f"one of {BACKENDS}", self.backend)
        require(self.rendezvous in RENDEZVOUS, "rendezvous", f"one of {RENDEZVOUS}", self.rendezvous)
        require(self.microbatch_groups >= 1, "microbatch_groups", ">= 1", self.microbatch_groups)
        require(self.max_tokens_per_micro_batch is None or self.max_tokens_per_micro_batch >= 2,
                "max_tokens_per_micro_batch", "None or >= 2", self.max_tokens_per_micro_batch)
        require(self.gpu in ACCELERATORS, "gpu", f"one of {tuple(ACCELERATORS)}", self.gpu)
        require(self.rank_cpus >= 0 and self.rank_gpus >= 0, "rank_cpus/rank_gpus", ">= 0",
                (self.rank_cpus, self.rank_gpus))
        require(self.device != "cuda" or self.rank_gpus > 0, "rank_gpus", "> 0 when device is "
                "'cuda'", self.rank_gpus)

    @property
    def distributed_backend(self) -> str | None:
        """The backend to ask torch.distributed for (None: its default for the device)."""
        return None if self.backend == "auto" else self.backend
