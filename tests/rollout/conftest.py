"""Fixtures for rollout tests: tiny checkpoints on disk (one torch thread: tests/conftest.py)."""

import pytest

from rlboost.models import build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A seeded Qwen3-style tiny checkpoint (2 layers, hidden 64, vocab 320)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), arch="qwen3", seed=0)


@pytest.fixture(scope="session")
def tiny_ckpt_other(tmp_path_factory):
    """Same shapes as tiny_ckpt, other weights."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-b"), arch="qwen3", seed=1)
