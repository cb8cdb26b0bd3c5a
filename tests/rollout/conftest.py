"""Fixtures for rollout tests: tiny checkpoints on disk and a quiet torch thread pool."""

import pytest
import torch

from rlboost.models import build_tiny_checkpoint


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny models run fastest on one intra-op thread, and the engine thread shares the pool.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A seeded Qwen3-style tiny checkpoint (2 layers, hidden 64, vocab 320)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), arch="qwen3", seed=0)


@pytest.fixture(scope="session")
def tiny_ckpt_other(tmp_path_factory):
    """Same shapes as tiny_ckpt, other weights."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-b"), arch="qwen3", seed=1)
