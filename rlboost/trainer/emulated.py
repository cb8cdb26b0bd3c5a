"""The emulated trainer: a stand-in for the FSDP trainer group of a named model on named GPUs
that takes the timing model's training time for each micro-batch instead of computing, and
publishes a payload whose pull takes the time the model's weights would take on the link.

It is chosen when rollout.emulated names a model (a run that emulates Qwen3-8B on H100s
would otherwise train a tiny CPU model whose compute says nothing about Qwen3-8B's). The
controller, the streaming loop, weight publication and pulls stay real. TrainerTiming is
also what the simulator charges, so both levels train for the same time.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.timing import LINK_BYTES_PER_S, gpu_timing
from rlboost.transfer.config import ServerConfig, TransferConfig, on_this_node  # noqa: F401 (doctest)
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.publisher import WeightPublisher
from rlboost.validate import check_format_version

SPEC_FORMAT_VERSION = 1
PAYLOAD_TENSOR = "emulated.weights"
MIN_PAYLOAD_BYTES = 1 << 16


class TrainerTiming:
    """Run seconds the trainer of `gpus` GPUs takes, from rlboost.timing (durations divided by
    the emulated cluster's time_scale; lengths in emulated tokens of token_block real ones).

    >>> from rlboost.rollout.emulated.config import EmulatedEngineConfig
    >>> t = TrainerTiming(EmulatedEngineConfig(model="qwen3-8b", efficiency=1.0), gpus=8)
    >>> round(t.microbatch_s([1000]), 3)  # 6 passes x 2 x 7.57e9 (no embedding) x 1000 / (8 x 989e12 x 0.387) + attention
    0.03
    """

    def __init__(self, emulated: EmulatedEngineConfig, gpus: int):
        if not emulated.model:
            raise ValueError("rollout.emulated.model must name a model of rlboost.timing for the emulated trainer")
        self.timing = gpu_timing(emulated.model, emulated.accelerator, gpus, emulated.efficiency)
        self.block = emulated.token_block
        self.scale = emulated.time_scale

    def microbatch_s(self, lengths: Iterable[int]) -> float:
        """A micro-batch of sequences of these lengths (prompt + response, emulated tokens)."""
        real = [n * self.block for n in lengths]
        return self.timing.train_s(len(real), float(sum(real)), float(sum(x * x for x in real))) / self.scale

    def payload_bytes(self, egress_bytes_per_s: int | None) -> int:
        """Bytes to publish so that a pull at the egress cap takes the run time the model's
        weights take over rlboost.timing.LINK_BYTES_PER_S."""
        if egress_bytes_per_s is None:
            raise ValueError("transfer.publisher.egress_bytes_per_s must be set for an emulated trainer: the published "
                             "payload is sized so that a pull at that cap takes the modelled time")
        seconds = self.timing.model.weight_bytes / LINK_BYTES_PER_S / self.scale
        return max(MIN_PAYLOAD_BYTES, int(seconds * egress_bytes_per_s) // 4 * 4)

    @staticmethod
    def check_scale(emulated: EmulatedEngineConfig, cost: Any) -> None:
        """One time_scale for every duration: the cost ledger must bill what the engines run."""
        if cost.time_scale != emulated.time_scale:
            raise ValueError(f"cost.time_scale ({cost.time_scale}) must equal rollout.emulated.time_scale "
                             f"({emulated.time_scale}): one factor scales every duration of an emulated cluster")


@dataclass(frozen=True, kw_only=True, slots=True)
class EmulatedTrainerSpec:
    """How the emulated trainer starts.

    >>> EmulatedTrainerSpec(emulated=EmulatedEngineConfig(model="qwen3-8b"), gpus=8, checkpoint="/ckpt",
    ...                     transfer=TransferConfig(publisher=ServerConfig(egress_bytes_per_s=10**9))).gpus
    8
    """

    emulated: EmulatedEngineConfig
    gpus: int
    checkpoint: str
    transfer: TransferConfig
    format_version: int = SPEC_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, SPEC_FORMAT_VERSION)
        TrainerTiming(self.emulated, self.gpus).payload_bytes(self.transfer.publisher.egress_bytes_per_s)  # validates


class EmulatedTrainer:
    """The whole trainer group as one actor with TrainerRank's methods (wrap with ray.remote)."""

    def __init__(self, spec: EmulatedTrainerSpec):
        self.spec = spec
        self.timing = TrainerTiming(spec.emulated, spec.gpus)
        self.publisher = WeightPublisher(on_this_node(spec.transfer))
        self.payload = self.timing.payload_bytes(spec.transfer.publisher.egress_bytes_per_s)
        self._sums = {"tokens": 0, "microbatches": 0, "seconds": 0.0}

    def address(self) -> str:
        return self.publisher.address

    def endpoint(self) -> str:
        return "emulated://trainer"  # one process: there is no process group to meet in

    def setup(self, init_method: str | None = None, optimizer_state: str | None = None) -> int:
        return int(self.timing.timing.model.params)

    def accumulate(self, batch) -> None:
        """Take the time the micro-batch's forward and backward passes would take."""
        lengths = batch.attention_mask.sum(dim=1).tolist()
        seconds = self.timing.microbatch_s(int(n) for n in lengths if n > 0)
        time.sleep(seconds)
        self._sums["tokens"] += int(batch.response_mask.sum())
        self._sums["microbatches"] += 1
        self._sums["seconds"] += seconds

    def finish_step(self, denominator: float) -> dict:
        if not denominator > 0:
            raise ValueError(f"denominator must be > 0, got {denominator}")
        seconds = self.timing.timing.step_overhead_s() / self.timing.scale
        time.sleep(seconds)
        sums, self._sums = self._sums, {"tokens": 0, "microbatches": 0, "seconds": 0.0}
        return {"loss_sum": 0.0, "kl_sum": 0.0, "clipped_tokens": 0.0, "ratio_sum": float(sums["tokens"]),
                "tokens": sums["tokens"], "microbatches": sums["microbatches"], "grad_norm": 0.0,
                "train_s": sums["seconds"] + seconds}

    def publish(self, version: int) -> dict:
        """Stage the payload as `version` after the time staging the model's weights takes."""
        t0 = time.perf_counter()
        time.sleep(self.timing.timing.publish_s() / self.timing.scale)
        layout = [(PAYLOAD_TENSOR, "uint8", (self.payload,))]
        views = self.publisher.stage(version, Manifest.from_layout(version, layout, self.spec.transfer.alignment))
        views[PAYLOAD_TENSOR].fill_(version % 251)
        nbytes = self.publisher.commit(version).total_bytes
        return {"publish_s": time.perf_counter() - t0, "bytes": nbytes}

    def save_checkpoint(self, directory: str, tokenizer_dir: str | None = None) -> None:
        """The starting checkpoint (the emulated model does not change) and an empty optimizer."""
        out = Path(directory)
        shutil.copytree(self.spec.checkpoint, out / "model", dirs_exist_ok=True)
        torch.save({"optimizer": {}}, out / "optimizer.pt")

    def close(self) -> None:
        self.publisher.close()



def emulates_trainer(rollout: Any) -> bool:
    """Whether a run's trainer is emulated: its engines emulate a named model (rollout.emulated.model)."""
    return rollout.backend == "emulated" and bool(rollout.emulated.model)


def launch_emulated(spec: EmulatedTrainerSpec, cost: Any, actor_options: dict[str, Any]):
    """The emulated trainer as a one-actor TrainerGroup (cost: the run's CostConfig, whose
    time_scale must be the engines')."""
    import ray

    from rlboost.trainer.loop import TrainerGroup

    TrainerTiming.check_scale(spec.emulated, cost)
    return TrainerGroup([ray.remote(EmulatedTrainer).options(**actor_options).remote(spec)])
