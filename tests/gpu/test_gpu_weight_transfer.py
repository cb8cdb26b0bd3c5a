"""Weights published from CUDA tensors through pinned staging, pulled over loopback into pinned
host memory and copied into CUDA tensors arrive byte for byte (bench/gpu_transfer.py times it)."""

import pytest
import torch

from rlboost.transfer.config import TransferConfig
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.publisher import WeightPublisher
from rlboost.transfer.puller import WeightPuller

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def cuda_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = {"embed": ((4099, 512), torch.bfloat16), "norm": ((512,), torch.float32),
              "proj": ((512, 1531), torch.float16), "odd": ((7, 3, 5), torch.bfloat16)}
    return {n: torch.randn(s, generator=g, device="cuda").to(d) for n, (s, d) in shapes.items()}


def pin(tensor: torch.Tensor) -> None:
    """Page-lock the whole storage under `tensor` (memory torch did not allocate)."""
    cudart = torch.cuda.cudart()
    storage = tensor.untyped_storage()
    err = cudart.cudaHostRegister(storage.data_ptr(), storage.nbytes(), 0)
    assert err == cudart.cudaError.success, f"cudaHostRegister of the staging region failed: {err}"


def unpin(tensor: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(tensor.untyped_storage().data_ptr())


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_cuda_to_cuda_through_pinned_staging_is_byte_exact():
    weights = cuda_weights()
    config = TransferConfig(secret=b"gpu-check", relay=False)  # the landing buffer is ours alone
    with WeightPublisher(config) as publisher, WeightPuller(publisher.address, config) as puller:
        manifest = Manifest.build(1, weights, config.alignment)
        views = publisher.stage(1, manifest)
        staging = next(iter(views.values()))
        pin(staging)
        try:
            for name, t in weights.items():
                views[name].copy_(t, non_blocking=True)  # device to pinned host: DMA
            torch.cuda.synchronize()
            publisher.commit(1)
            landing = torch.empty(manifest.total_bytes, dtype=torch.uint8).pin_memory()
            pulled = puller.pull(1, into=landing, timeout=60)
            back = {name: pulled[name].to("cuda", non_blocking=True) for name in weights}
            torch.cuda.synchronize()
        finally:
            unpin(staging)
    for name, t in weights.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(as_bytes(back[name]), as_bytes(t)), name
