"""The constructed examples in the migration records' docstrings run as written."""

import doctest

import pytest

from rlboost.migration import batch, kv, state


@pytest.mark.parametrize("module", [state, kv, batch], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0
