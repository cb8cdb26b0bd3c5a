"""Controller tests: handoff endpoints opened by the fakes are closed after each test."""

import controller_fakes
import pytest


@pytest.fixture(autouse=True)
def close_handoff_endpoints():
    yield
    while controller_fakes.OPEN_ENDPOINTS:
        controller_fakes.OPEN_ENDPOINTS.pop().close()
