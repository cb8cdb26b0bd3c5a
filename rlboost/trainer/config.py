"""TrainerConfig: the FSDP2 trainer group of a run, holding its sharding and optimizer
configs whole, so `--set trainer.optimizer.lr=...` reaches the optimizer unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.timing import ACCELERATORS
from rlboost.trainer.fsdp import FSDPConfig, OptimizerConfig
from rlboost.validate import require

DEVICES = ("cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
RENDEZVOUS = ("file", "tcp")


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
