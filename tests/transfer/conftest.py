"""Fixtures for the transfer tests (helpers live in helpers.py)."""

from __future__ import annotations

import pytest

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
def server_processes():
    started: list[ServerProcess] = []

    def start(*args, **kwargs) -> ServerProcess:
        s = ServerProcess(*args, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.kill()
