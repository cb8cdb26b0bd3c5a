"""Tiny models gain nothing from intra-op threads, and on a busy 2-core machine their
spin-waiting costs several times the work itself: run these tests on one thread."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
