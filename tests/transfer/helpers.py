"""Helpers shared by the transfer tests: configs with small chunks (so small payloads span
many chunks) and short deadlines (so failures show fast), test tensors, and publishers in
child processes that a test can kill."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import torch

from rlboost import _C, _C_testing
from rlboost.errors import TransferTimeout
from rlboost.transfer import TransferConfig

SECRET = b"test-secret"
CHUNK = 64 << 10
BUILT_TRANSPORTS = [t["name"] for t in _C.transports()]


def make_config(**overrides) -> TransferConfig:
    base = dict(secret=SECRET, chunk_bytes=CHUNK, streams=2, request_timeout_s=10.0,
                connect_timeout_s=5.0, reconnect_attempts=1, alignment=256)
    base.update(overrides)
    return TransferConfig(**base)


def random_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(300, 97, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(97, 203, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(97, generator=g).to(torch.float16),
        "step": torch.tensor([7], dtype=torch.int64),
        "mask": torch.rand(33, generator=g) > 0.5,
        "empty": torch.empty(0, 4),
    }


def assert_same(pulled, expected: dict[str, torch.Tensor]) -> None:
    assert set(pulled) == set(expected)
    for name, t in expected.items():
        got = pulled[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        assert torch.equal(got, t), name


def wait_for_bytes(handle, nbytes: int, timeout: float = 30.0) -> None:
    """Waits (on the pull itself, in short slices) until at least nbytes have arrived."""
    waited = 0.0
    while handle.bytes_done < nbytes:
        try:
            handle.wait(timeout=0.02)
        except TransferTimeout:
            waited += 0.02
            if waited > timeout:
                raise
            continue
        raise AssertionError("pull finished before the awaited point")


def wait_for_chunks_from(handle, address: str, timeout: float = 30.0) -> None:
    """Waits (on the pull itself, in short slices) until `address` has delivered a chunk."""
    deadline = time.monotonic() + timeout
    while not any(s["address"] == address and s["chunks"] > 0 for s in handle.stats()["sources"]):
        if handle.poll(0.02):
            raise AssertionError(f"pull finished before {address} served a chunk")
        if time.monotonic() > deadline:
            raise AssertionError(f"{address} served no chunk in {timeout} s")


class ServerProcess:
    """A publisher in a child process serving `payload(nbytes, seed)` as version 1."""

    def __init__(self, nbytes: int, seed: int = 0, egress: int = 0, chunk: int = CHUNK):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.transfer.serve_weights", "--nbytes", str(nbytes),
             "--seed", str(seed), "--egress", str(egress), "--chunk", str(chunk),
             "--secret", SECRET.decode()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root,
        )
        self.address = self.proc.stdout.readline().strip()
        assert self.address, "server process did not start"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        self._close_pipes()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


def wait_until(condition, timeout: float = 30.0) -> bool:
    """Polls condition() every 50 ms until it holds (True) or timeout s pass (False)."""
    deadline, tick = time.monotonic() + timeout, threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            return False
        tick.wait(0.05)
    return True


def corrupt_served_byte(pub, version: int, offset: int) -> None:
    """Flips one byte of a version `pub` serves, in place (the test-only native hook)."""
    _C_testing.corrupt_byte(pub._versions.store, version, offset)
