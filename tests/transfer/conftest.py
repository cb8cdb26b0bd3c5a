"""Fixtures for the transfer tests (helpers live in helpers.py)."""

from __future__ import annotations

import pytest
import torch

from rlboost.transfer import TransferConfig, WeightPublisher

from .helpers import ServerProcess, make_config


@pytest.fixture
def config() -> TransferConfig:
    return make_config()


@pytest.fixture
def publisher(config):
    with WeightPublisher(config) as pub:
        yield pub


@pytest.fixture
def served(publisher):
    """A publisher holding version 1: one 300,000-byte random blob (not a chunk multiple)."""
    blob = torch.randint(0, 256, (300_000,), dtype=torch.uint8)
    publisher.publish(1, {"blob": blob})
    return publisher, blob


@pytest.fixture
def server_processes():
    started: list[ServerProcess] = []

    def start(*args, **kwargs) -> ServerProcess:
        s = ServerProcess(*args, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()  # also closes its pipes
