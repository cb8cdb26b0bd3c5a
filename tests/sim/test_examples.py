"""The examples in the timing model's, the emulated engine's and the simulator's docstrings run as written."""

import doctest
import importlib

import pytest

MODULES = ["rlboost.timing", "rlboost.rollout.emulated.lengths", "rlboost.rollout.emulated.pace",
           "rlboost.rollout.emulated.schedule", "rlboost.rollout.emulated.config", "rlboost.controller.continuation",
           "rlboost.trainer.emulated", "rlboost.sim.workload", "rlboost.cluster.traces.availability"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
