"""A Ray cluster a run joins must offer the run's custom resources, or the run stops at
once with what to start the nodes with (rather than actors pending until a timeout)."""

from __future__ import annotations

import pytest

from rlboost.cluster.session import RaySettings, check_resources
from rlboost.errors import ConfigError


@pytest.mark.parametrize("have", [{"CPU": 8.0}, {"reserved": 4.0}, {"reserved": 2.0, "preemptible": 3.0}])
def test_a_cluster_without_the_run_resources_is_refused_with_the_fix(have):
    with pytest.raises(ConfigError, match=r"reserved >= 3 .*ray start --resources"):
        check_resources(have, RaySettings(reserved=3, preemptible=2))


def test_a_cluster_with_them_is_accepted():
    check_resources({"CPU": 8.0, "reserved": 3.0, "preemptible": 1.0}, RaySettings(reserved=3, preemptible=5))
