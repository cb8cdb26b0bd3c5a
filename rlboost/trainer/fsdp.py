"""FSDP2 sharding of a decoder model, process-group setup and the optimizer step.

Works on any nn.Module whose decoder blocks are `model.model.layers` (the Hugging Face
layout rlboost's models follow). FSDP2 only (`fully_shard`): it keeps parameter names
unchanged, which the weight publisher relies on.
"""

from __future__ import annotations

import datetime
import gc
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlboost.models.checkpoint import TORCH_DTYPES
from rlboost.trainer.config import FSDPConfig, OptimizerConfig
from rlboost.trainer.gather import full_state_dict, iter_full_parameters

__all__ = ["FSDPConfig", "OptimizerConfig", "build_optimizer", "decoder_layers",
           "destroy_distributed", "full_state_dict", "init_distributed", "iter_full_parameters",
           "optimizer_step", "shard_model"]

def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1",
                     master_port: int = 29500, backend: str | None = None,
                     timeout_s: float = 300.0, init_method: str | None = None) -> DeviceMesh:
    """Join the trainer's process group and return its 1-D device mesh.

    Every rank (each its own process) calls this with the same master address and port;
    rank 0 serves the rendezvous there. init_method (e.g. "file:///tmp/rdzv") replaces
    that rendezvous when all ranks share a file system. backend defaults to NCCL when
    CUDA is available and gloo otherwise; on GPU a rank uses device rank % device_count
    (a Ray actor that sees one GPU uses device 0).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if not 1 <= master_port <= 65535:
        raise ValueError(f"master_port must be in [1, 65535], got {master_port}")
    use_cuda = torch.cuda.is_available() if backend is None else backend == "nccl"
    backend = backend or ("nccl" if use_cuda else "gloo")
    device_type = "cuda" if use_cuda else "cpu"
    device_id = None
    if use_cuda:
        device_id = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device_id)
    init_method = init_method or f"tcp://{master_addr}:{master_port}"
    dist.init_process_group(backend=backend, init_method=init_method,
                            rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), device_id=device_id)
    return init_device_mesh(device_type, (world_size,))


def destroy_distributed(*, barrier: bool = True) -> None:
    """Leave the process group (no-op when none was joined).

    With barrier, every rank must call it: a fast rank then cannot close its connections
    while a slower one still talks to it (gloo aborts a process whose peer vanishes
    mid-transfer). Pass barrier=False on an error path, where peers may never arrive.
    Drop sharded models and optimizers first: anything still holding the process group
    is torn down at interpreter exit instead, where gloo's threads can abort the process.
    """
    if dist.is_initialized():
        gc.collect()  # sharded modules sit in reference cycles; free them while Python is whole
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder blocks of a Hugging Face-layout model (`model.model.layers`)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: FSDP wrapping needs "
                         "the decoder blocks at model.model.layers")
    return list(layers)


def shard_model(model: nn.Module, mesh: DeviceMesh, config: FSDPConfig | None = None, *,
                offload: bool = False) -> nn.Module:
    """fully_shard each decoder block, then the root (embeddings, final norm, head).

    Sharding per block lets FSDP2 all-gather one block's weights at a time in forward and
    backward. offload keeps the shards and their gradients in host memory (FSDP2's
    CPUOffloadPolicy: copied to the device per block for compute), so the optimizer's
    state and step stay on the host too; on a CPU mesh everything is there already and
    the policy changes nothing. The model is changed in place and returned.
    """
    config = config or FSDPConfig()
    mp = MixedPrecisionPolicy(
        param_dtype=TORCH_DTYPES[config.param_dtype] if config.param_dtype else None,
        reduce_dtype=TORCH_DTYPES[config.reduce_dtype] if config.reduce_dtype else None)
    kwargs = {"mesh": mesh, "reshard_after_forward": config.reshard_after_forward, "mp_policy": mp}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda")
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if config.grad_reduction == "sum":
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                # A plain SUM collective: gloo has no PREMUL_SUM, and NCCL's zero-copy
                # path wants SUM as well.
                module.set_force_sum_reduction_for_comms(True)
    return model


def build_optimizer(model: nn.Module, config: OptimizerConfig | None = None) -> torch.optim.AdamW:
    """AdamW over the (sharded) parameters: each rank keeps state for its shard only."""
    config = config or OptimizerConfig()
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                             betas=(config.beta1, config.beta2), eps=config.eps,
                             weight_decay=config.weight_decay)


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                   config: OptimizerConfig | None = None) -> float:
    """Clip the global gradient norm (when configured), step, zero the grads; return the norm.

    The norm is over full (unsharded) gradients, identical on every rank.
    """
    config = config or OptimizerConfig()
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = config.max_grad_norm if config.max_grad_norm is not None else math.inf
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
