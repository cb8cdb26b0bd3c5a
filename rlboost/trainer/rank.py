"""TrainerRank: one FSDP2 rank of the trainer group (a Ray actor in a run).

It accumulates GRPO gradients micro-batch by micro-batch, steps the optimizer once the
step's batch is complete, publishes each new weight version bucket by bucket straight
into the weight publisher's staging area (rank 0 serves it), and saves or restores
checkpoints, each rank's own random state included. Every method except address() is
collective: call it on all ranks at once.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlboost.errors import CheckpointError
from rlboost.models.checkpoint import TORCH_DTYPES
from rlboost.trainer import rng
from rlboost.trainer.batch import MicroBatch, micro_batch_loss, reference_logprobs
from rlboost.trainer.config import DTYPES, FSDPConfig, OptimizerConfig
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.model_impl import model_impl
from rlboost.transfer.config import TransferConfig, node_ip, on_this_node
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.publisher import WeightPublisher
from rlboost.validate import check_format_version

RANK_SPEC_FORMAT_VERSION = 1
OPTIMIZER_FILE = "optimizer.pt"
MODEL_DIR = "model"


def _fsdp():
    """The FSDP2 helpers, imported in the rank's own process on first use: the driver and
    the controller hold this actor class only as a handle and need not load
    torch.distributed's FSDP and checkpoint modules (about a second of every start)."""
    from rlboost.trainer import fsdp

    return fsdp


@dataclass(frozen=True, kw_only=True, slots=True)
class RankSpec:
    """How one rank starts.

    >>> RankSpec(rank=0, world_size=2, checkpoint="/ckpt/tiny", transfer=TransferConfig()).device
    'cpu'

    checkpoint holds the weights to train from; reference_checkpoint the frozen reference
    policy (used only with grpo.kl_coef > 0; default: checkpoint). transfer configures
    rank 0's weight publisher; publish_dtype is the dtype the rollout engines load. impl
    (model.impl) says which code runs the model; activation_checkpointing, the token budget
    and packing are the trainer config's (TrainerGroup splits micro-batches by the last two).
    """

    rank: int
    world_size: int
    checkpoint: str
    transfer: TransferConfig
    reference_checkpoint: str | None = None
    device: str = "cpu"
    backend: str | None = None
    sharding: FSDPConfig = field(default_factory=FSDPConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    publish_dtype: str = "float32"
    torch_threads: int = 1
    impl: str = "rlboost"
    activation_checkpointing: bool = False
    max_tokens_per_micro_batch: int | None = None
    packing: bool = False
    format_version: int = RANK_SPEC_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, RANK_SPEC_FORMAT_VERSION)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if self.publish_dtype not in DTYPES:
            raise ValueError(f"publish_dtype must be one of {DTYPES}, got {self.publish_dtype!r}")
        model_impl(self.impl)  # ValueError naming model.impl


class TrainerRank:
    """One rank: construct, then setup() on every rank together (it joins the process group)."""

    def __init__(self, spec: RankSpec):
        torch.set_num_threads(spec.torch_threads)  # many ranks and engines share a few cores
        self.spec = spec
        # bound to every interface, it advertises this Ray node's address (what other nodes dial)
        self.publisher = WeightPublisher(on_this_node(spec.transfer)) if spec.rank == 0 else None
        self.model = self.ref_model = self.optimizer = None
        self._sums = _StepSums()

    def address(self) -> str | None:
        """Where rank 0's weight publisher serves (None on other ranks)."""
        return self.publisher.address if self.publisher is not None else None

    def endpoint(self) -> str:
        """A tcp:// rendezvous address on this rank's host (ask rank 0, hand it to all)."""
        import socket

        host = node_ip() or "127.0.0.1"
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        return f"tcp://{host}:{port}"

    def setup(self, init_method: str, optimizer_state: str | None = None) -> int:
        """Join the process group (init_method: "file://..." or rank 0's endpoint()), load and
        shard the model; optionally restore the optimizer from a checkpoint's optimizer file
        and each rank's random state from the rng_rank{r}.pt files beside it. Returns the
        number of parameters."""
        s = self.spec
        mesh = _fsdp().init_distributed(s.rank, s.world_size, backend=s.backend, init_method=init_method)
        self.device = torch.device(s.device if s.device == "cpu" else f"cuda:{torch.cuda.current_device()}")
        impl = model_impl(s.impl)
        model = impl.load(s.checkpoint, self.device)
        if s.activation_checkpointing:
            impl.checkpoint_layers(model)
        self.model_config = model.config
        num_params = sum(p.numel() for p in model.parameters())
        self.model = _fsdp().shard_model(model, mesh, s.sharding, offload=s.optimizer.offload)
        self.optimizer = _fsdp().build_optimizer(self.model, s.optimizer)
        if s.grpo.kl_coef > 0:  # no gradients, no optimizer: nothing of it to offload
            ref = impl.load(s.reference_checkpoint or s.checkpoint, self.device)
            self.ref_model = _fsdp().shard_model(ref.requires_grad_(False), mesh, s.sharding)
        if optimizer_state is not None:
            self._load_optimizer(optimizer_state)
            rng.load_all(Path(optimizer_state).parent, self.device)
        return num_params

    # -- one step ----------------------------------------------------------------------------

    def accumulate(self, batch: MicroBatch) -> None:
        """Forward and backward one micro-batch share; the loss is a sum (see finish_step)."""
        t0 = time.perf_counter()
        batch = batch.to(self.device)
        ref = reference_logprobs(self.ref_model, batch) if self.ref_model is not None else None
        out = micro_batch_loss(self.model, batch, self.spec.grpo,
                               denominator=1.0, ref_logprobs=ref)
        out.loss.backward()
        self._sums.add(out, time.perf_counter() - t0)

    def finish_step(self, denominator: float) -> dict:
        """Divide the summed gradients by the step's denominator (its response tokens, or
        sequences for seq_mean), clip, step the optimizer. Returns this rank's sums."""
        if not denominator > 0:
            raise ValueError(f"denominator must be > 0, got {denominator}")
        t0 = time.perf_counter()
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(1.0 / denominator)
        norm = _fsdp().optimizer_step(self.model, self.optimizer, self.spec.optimizer)
        sums, self._sums = self._sums, _StepSums()
        return {**sums.as_dict(), "grad_norm": norm, "lr": self.optimizer.param_groups[0]["lr"],
                "train_s": sums.seconds + time.perf_counter() - t0}

    # -- weights -----------------------------------------------------------------------------

    def publish(self, version: int) -> dict:
        """Gather the full weights bucket by bucket into the publisher's staging area (rank 0)
        and start serving them as `version`. Extra memory: one bucket."""
        t0 = time.perf_counter()
        dtype = TORCH_DTYPES[self.spec.publish_dtype]
        views = None
        if self.publisher is not None:
            layout = [(name, self.spec.publish_dtype, tuple(p.shape)) for name, p in self.model.named_parameters()]
            views = self.publisher.stage(version, Manifest.from_layout(version, layout,
                                                                       self.spec.transfer.alignment))
        try:
            for _ in _fsdp().iter_full_parameters(self.model, bucket_bytes=self.spec.sharding.gather_bucket_bytes,
                                               dtype=dtype, into=views):
                pass
        except BaseException:
            if self.publisher is not None:
                self.publisher.discard(version)
            raise
        nbytes = self.publisher.commit(version).total_bytes if self.publisher is not None else 0
        # The delta into `version` is encoded from here on, off this path; report the latest done.
        deltas = self.publisher.delta_stats()[-1:] if self.publisher is not None else []
        return {"publish_s": time.perf_counter() - t0, "bytes": nbytes, "delta": deltas[0] if deltas else {}}

    def save_checkpoint(self, directory: str, tokenizer_dir: str | None = None) -> None:
        """Model (HF-style safetensors via save_pretrained), the full optimizer state and
        every rank's random state, written by rank 0. The caller marks the checkpoint complete."""
        rng.save_all(Path(directory), self.device)
        impl = model_impl(self.spec.impl)
        shell = impl.shell(self.model_config) if self.spec.rank == 0 else None
        into = dict(shell.named_parameters()) if shell is not None else None
        for _ in _fsdp().iter_full_parameters(self.model, bucket_bytes=self.spec.sharding.gather_bucket_bytes,
                                           into=into):
            pass
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(self.model, self.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if shell is None:
            return
        out = Path(directory)
        impl.save(shell, out / MODEL_DIR)
        if tokenizer_dir is not None:
            _copy_tokenizer(Path(tokenizer_dir), out / MODEL_DIR)
        torch.save({"optimizer": state}, out / OPTIMIZER_FILE)

    def _load_optimizer(self, path: str) -> None:
        saved = read_optimizer_file(path) if self.spec.rank == 0 else {}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=saved.get("optimizer", {}),
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        if "torch_rng" in saved:  # a checkpoint from before per-rank random state files
            torch.set_rng_state(saved["torch_rng"])

    def close(self) -> None:
        """Leave the process group (every rank) and stop serving weights."""
        self.model = self.ref_model = self.optimizer = None
        _fsdp().destroy_distributed()
        if self.publisher is not None:
            self.publisher.close()



def read_optimizer_file(path: str) -> dict:
    """optimizer.pt as save_checkpoint writes it (tensors, numbers, strings: every version
    of rlboost wrote only these), read with weights_only=True so a checkpoint cannot run
    code. A file that needs more was not written by rlboost: CheckpointError says so."""
    try:
        saved = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: holds more than tensors and numbers ({first[:200]}); rlboost reads "
                              "optimizer state with weights_only=True: resume from a checkpoint rlboost wrote") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: expected a dict with an 'optimizer' entry, got {type(saved).__name__}")
    return saved


class _StepSums:
    """Per-rank sums over a step's micro-batches (tokens, loss, clipped tokens, ratios)."""

    def __init__(self) -> None:
        self.loss = self.kl = self.clipped = self.ratio = self.seconds = 0.0
        self.tokens = self.microbatches = 0
        self.is_weight = self.is_truncated = 0.0
        self.decoupled_tokens = 0

    def add(self, out, seconds: float) -> None:
        if out.decoupled:
            self.is_weight += out.is_weight_mean * out.num_tokens
            self.is_truncated += out.is_truncated_fraction * out.num_tokens
            self.decoupled_tokens += out.num_tokens
        self.loss += out.policy_loss
        self.kl += out.kl
        self.clipped += out.clip_fraction * out.num_tokens
        self.ratio += out.mean_ratio * out.num_tokens
        self.tokens += out.num_tokens
        self.microbatches += 1
        self.seconds += seconds

    def as_dict(self) -> dict:
        out = {"loss_sum": self.loss, "kl_sum": self.kl, "clipped_tokens": self.clipped,
               "ratio_sum": self.ratio, "tokens": self.tokens, "microbatches": self.microbatches}
        if self.decoupled_tokens:  # bounded staleness: the behaviour importance weights
            out.update(is_weight_sum=self.is_weight, is_truncated_tokens=self.is_truncated,
                       decoupled_tokens=self.decoupled_tokens)
        return out


def _copy_tokenizer(src: Path, dst: Path) -> None:
    import shutil

    for name in ("byte_tokenizer.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
