"""Full (unsharded) weights out of an FSDP2 model, bucket by bucket, onto one rank.

The weight publisher consumes this: shards of a bucket travel as one gather into a
reused buffer, and each parameter lands either in a fresh tensor or straight in a
caller-given destination (a staging view), so extra memory stays near one bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from rlboost.models.buckets import buckets


@dataclass
class _Buffers:
    """Send and receive buffers reused across buckets (fresh memory faults in slowly)."""

    send: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    recv: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    def get(self, which: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        pool = self.send if which == "send" else self.recv
        buf = pool.get(dtype)
        if buf is None or buf.numel() < numel or buf.device != device:
            buf = pool[dtype] = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel]


def iter_full_parameters(model: nn.Module, *, bucket_bytes: int = 64 << 20,
                         dtype: torch.dtype | None = None, dst: int = 0,
                         into: Mapping[str, torch.Tensor] | None = None,
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for every parameter on rank dst, one bucket at a time.

    Every rank must drive the iterator to the end (each bucket is one collective); ranks
    other than dst (a global rank) yield nothing. Shards are cast to dtype before they
    travel when it is given (halving traffic for bfloat16). Without into, each yielded
    tensor is a fresh full tensor. With into (on dst: name -> contiguous tensor of the
    parameter's shape and output dtype, e.g. views into a staging area), the weights are
    written there and those tensors are yielded; a bad into fails on every rank before
    any transfer. Tied parameters appear once (as their first name).
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    named = list(model.named_parameters())
    _check_into(named, dtype, into if rank == dst else None)
    buffers = _Buffers()

    def out_dtype(item: tuple[str, torch.Tensor]) -> torch.dtype:
        return dtype or item[1].dtype

    # one gather per bucket into one typed buffer: a new dtype starts a new bucket
    for bucket in buckets(named, bucket_bytes=bucket_bytes, kind=out_dtype,
                          nbytes=lambda item: item[1].numel() * out_dtype(item).itemsize):
        yield from _gather_bucket(bucket, out_dtype(bucket[0]), dst, rank, into, buffers)


def full_state_dict(model: nn.Module, *, dtype: torch.dtype | None = None,
                    bucket_bytes: int = 64 << 20) -> dict[str, torch.Tensor]:
    """All parameters as full CPU tensors on rank 0 (empty elsewhere); for checkpoints and tests."""
    return {name: t.detach().cpu().clone()
            for name, t in iter_full_parameters(model, bucket_bytes=bucket_bytes, dtype=dtype)}


def _check_into(named: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None,
                into: Mapping[str, torch.Tensor] | None) -> None:
    problem = ""
    if into is not None:
        for name, param in named:
            target = into.get(name)
            want = dtype or param.dtype
            if target is None:
                problem = f"into has no tensor for {name}"
            elif tuple(target.shape) != tuple(param.shape) or target.dtype != want:
                problem = (f"into[{name!r}] is {target.dtype} {tuple(target.shape)}, "
                           f"expected {want} {tuple(param.shape)}")
            elif not target.is_contiguous():
                problem = f"into[{name!r}] is not contiguous"
            if problem:
                break
    if dist.is_initialized() and named:
        # Agree first, so a bad destination on dst fails every rank at once instead of
        # leaving the others blocked in a gather.
        device = _local(named[0][1]).device
        flag = torch.tensor([0 if problem else 1], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if not problem and int(flag) == 0:
            problem = "the destination tensors on the gathering rank do not fit"
    if problem:
        raise ValueError(problem)


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _is_row_sharded(param: torch.Tensor) -> bool:
    return (isinstance(param, DTensor) and param.device_mesh.ndim == 1 and param.dim() >= 1
            and tuple(param.placements) == (Shard(0),))


def _rows_per_rank(rows: int, world: int) -> list[int]:
    # FSDP2 splits dim 0 like torch.chunk: ceil(rows / world) rows each, the tail shorter
    # and trailing ranks possibly empty.
    chunk = -(-rows // world)
    return [max(0, min(chunk, rows - k * chunk)) for k in range(world)]


def _gather_bucket(bucket, dtype, dst, rank, into, buffers) -> Iterator[tuple[str, torch.Tensor]]:
    sharded = [(n, p) for n, p in bucket if _is_row_sharded(p)]
    for name, param in bucket:
        if not _is_row_sharded(param):
            # Replicated, multi-dim-mesh or plain parameters: DTensor handles them itself.
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if rank == dst:
                full = full.detach()
                if into is not None:
                    yield name, into[name].copy_(full)
                    continue
                # a fresh tensor, as promised: never the live parameter (or a view of it),
                # which the next optimizer step would change under the caller
                shared = full.untyped_storage().data_ptr() == _local(param).untyped_storage().data_ptr()
                yield name, full.to(dtype, copy=shared)
    if sharded:
        yield from _gather_row_sharded(sharded, dtype, dst, rank, into, buffers)


def _gather_row_sharded(params, dtype, dst, rank, into, buffers):
    mesh = params[0][1].device_mesh
    world, me = mesh.size(), mesh.get_local_rank()
    layout = []  # (name, shape, row numel, rows per rank, offset in each rank's slot)
    slot = 0
    for name, p in params:
        rows = _rows_per_rank(p.shape[0], world)
        row_numel = math.prod(p.shape[1:])
        layout.append((name, p.shape, row_numel, rows, slot))
        slot += rows[0] * row_numel
    device = params[0][1].to_local().device
    send = buffers.get("send", slot, dtype, device)
    for (name, p), (_, _, row_numel, rows, off) in zip(params, layout):
        local = p.to_local().detach()
        if local.numel() != rows[me] * row_numel:
            raise RuntimeError(f"{name}: local shard has {local.numel()} elements, expected "
                               f"{rows[me] * row_numel} for a dim-0 split over {world}")
        send[off:off + local.numel()].copy_(local.reshape(-1))
    if rank != dst:
        dist.gather(send, dst=dst, group=mesh.get_group())
        return
    recv = buffers.get("recv", world * slot, dtype, device).view(world, slot)
    dist.gather(send, gather_list=list(recv.unbind(0)), dst=dst, group=mesh.get_group())
    for name, shape, row_numel, rows, off in layout:
        pieces = [recv[k, off:off + rows[k] * row_numel] for k in range(world) if rows[k]]
        if into is None:
            yield name, torch.cat(pieces).view(shape)
            continue
        flat, start = into[name].view(-1), 0
        for piece in pieces:
            flat[start:start + piece.numel()].copy_(piece)
            start += piece.numel()
        yield name, into[name]
