"""The one place where tensors become (address, nbytes[, device]) descriptors for the
native core, and where native memory becomes tensors again (zero-copy views that keep it
alive). Weight transfer and the migration codecs both describe their tensors here.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import torch

from rlboost.transfer.manifest import Manifest

HOST_DEVICE = -1  # the native core's device id of host memory


def describe(tensor: torch.Tensor) -> tuple[int, int]:
    """(address, nbytes) of a contiguous CPU tensor's bytes."""
    if tensor.device.type != "cpu":
        raise ValueError(f"destination must be in CPU memory, got a tensor on {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError("destination tensor must be contiguous")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


def describe_on_device(tensor: torch.Tensor) -> tuple[int, int, int]:
    """(address, nbytes, device id) of a contiguous tensor in host memory (HOST_DEVICE) or
    on a CUDA device (its index)."""
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous")
    if tensor.device.type == "cpu":
        device = HOST_DEVICE
    elif tensor.device.type == "cuda":
        device = tensor.device.index
    else:
        raise ValueError(f"tensors on {tensor.device.type} are not supported (cpu or cuda only)")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), device


def byte_view(tensor: torch.Tensor, name: str = "into") -> torch.Tensor:
    """The bytes of a pull destination (a contiguous, writable CPU tensor) as a flat uint8
    view (no copy); ValueError naming `name` when it cannot be written."""
    describe(tensor)
    require_writable(tensor, name)
    return tensor.reshape(-1).view(torch.uint8)


def require_writable(tensor: torch.Tensor, name: str) -> None:
    """ValueError naming `name` unless the native core may write the tensor's host bytes.

    What is checked: that every page of the tensor is mapped writable in this process
    (Linux /proc/self/maps), which catches np.memmap(mode="r"), read-only mmaps and
    read-only shared memory -- the memory a native write would fault on and crash the
    process. What cannot be checked: memory that is writable page-wise but belongs to an
    immutable Python object (torch.frombuffer over `bytes`); torch warns when such a
    tensor is made. Device memory is not checked (it has no read-only mappings).
    """
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.device.type != "cpu" or nbytes == 0:
        return
    if tensor.untyped_storage().resizable():
        return  # torch allocated it (anonymous or shared memory, always writable)
    span = (tensor.data_ptr(), nbytes)
    seen = _verified.get(id(tensor))
    if seen is not None and seen[0]() is tensor and seen[1] == span:
        return  # checked before, and the tensor has kept its memory alive since
    if not _pages_writable(*span):
        raise ValueError(f"{name}: its memory is not mapped writable (a read-only mapping such as "
                         f"np.memmap(mode='r')?); pass a writable tensor")
    key = id(tensor)
    _verified[key] = (weakref.ref(tensor, lambda ref: _forget(key, ref)), span)


# Reading /proc/self/maps costs ~0.6 ms, as much as a small pull: foreign memory (numpy,
# mmaps, native regions) is checked once per tensor, which keeps that memory mapped for as
# long as it lives. Entries go with their tensors.
_verified: dict[int, tuple[weakref.ref, tuple[int, int]]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _verified.get(key)
    if entry is not None and entry[0] is ref:
        del _verified[key]


def _pages_writable(address: int, nbytes: int) -> bool:
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return True  # no page table to consult on this platform
    start, end = address, address + nbytes
    for line in lines:  # sorted by address, one mapping per line: "lo-hi perms ..."
        span, perms = line.split(b" ", 2)[:2]
        lo, hi = (int(x, 16) for x in span.split(b"-"))
        if hi <= start:
            continue
        if lo > start or perms[1:2] != b"w":
            return False  # a hole in the range, or a mapping without write permission
        start = hi
        if start >= end:
            return True
    return False


def region_tensor(region: object) -> torch.Tensor:
    """A writable uint8 tensor over a native Region; the tensor keeps the region alive."""
    if region.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(region, dtype=torch.uint8)


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two byte buffers overlap."""
    (pa, na), (pb, nb) = describe(a), describe(b)
    return na > 0 and nb > 0 and pa < pb + nb and pb < pa + na


def tensor_views(buffer: torch.Tensor, manifest: Manifest) -> dict[str, torch.Tensor]:
    """Named tensors over a flat uint8 buffer laid out by the manifest (no copy)."""
    if buffer.numel() < manifest.total_bytes:
        raise ValueError(f"buffer of {buffer.numel()} bytes is smaller than the payload ({manifest.total_bytes})")
    views = {}
    for s in manifest.tensors:
        raw = buffer[s.offset : s.offset + s.nbytes]
        views[s.name] = raw.view(getattr(torch, s.dtype)).view(s.shape)
    return views


def copy_tensors(views: Mapping[str, torch.Tensor], named_tensors: Mapping[str, torch.Tensor]) -> None:
    """Copies tensors (any device, any strides) into their staging views."""
    for name, t in named_tensors.items():
        dst = views[name]
        if tuple(t.shape) != tuple(dst.shape) or t.dtype != dst.dtype:
            raise ValueError(f"tensor {name!r}: {t.dtype}{tuple(t.shape)} does not match the manifest's "
                             f"{dst.dtype}{tuple(dst.shape)}")
        dst.copy_(t)
