"""The examples in the controller's docstrings run as written."""

import doctest
import importlib

import pytest

MODULES = ["rlboost.controller.clock", "rlboost.controller.records", "rlboost.controller.estimates",
           "rlboost.controller.offload.window", "rlboost.controller.offload.adaptive",
           "rlboost.controller.offload.reference", "rlboost.controller.metrics", "rlboost.controller.collector",
           "rlboost.sim.workload",
           "rlboost.rollout.emulated.engine", "rlboost.rollout.emulated.tokens", "rlboost.rollout.engine",
           "rlboost.rollout.embedded.forward"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
