"""Test-wide settings: keep Ray on loopback and small; tiny models on one torch thread."""

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine their
# spin-waiting costs several times the work itself (an engine thread shares the pool too).
_ONE_THREAD = ("rollout", "tasks", "trainer", "test_train_loop.py")


@pytest.fixture
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).parent
    for item in items:
        path = Path(item.fspath)
        if path.is_relative_to(root) and path.relative_to(root).parts[0] in _ONE_THREAD:
            item.fixturenames.insert(0, "one_torch_thread")
