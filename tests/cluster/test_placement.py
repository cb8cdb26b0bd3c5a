"""A run whose processes cannot all be placed is refused before anything starts, with the
numbers: GPUs needed on reserved nodes, and room for every preemptible instance."""

from __future__ import annotations

import pytest

from rlboost.cluster.placement import GpuNeeds, check_cluster, check_local
from rlboost.errors import ConfigError

PAPER = GpuNeeds(trainer_ranks=4, gpus_per_rank=1, reserved_engines=2, gpus_per_engine=2, preemptible=4,
                 gpus_per_instance=2)


def test_a_machine_without_gpus_is_refused_with_both_counts():
    with pytest.raises(ConfigError, match=r"needs 16 GPUs .* this machine has 0"):
        check_local(PAPER, gpus=0)


def test_a_cpu_run_needs_no_gpu():
    check_local(GpuNeeds(trainer_ranks=2, gpus_per_rank=0, reserved_engines=1, gpus_per_engine=0,
                         preemptible=3, gpus_per_instance=0), gpus=0)


def test_the_paper_shape_fits_one_reserved_and_one_spot_node():
    check_cluster(PAPER, [{"GPU": 8, "reserved": 6}, {"GPU": 8, "preemptible": 4}])


def test_reserved_gpus_short_are_named():
    with pytest.raises(ConfigError, match=r"needs 8 GPUs on reserved nodes .* have 4"):
        check_cluster(PAPER, [{"GPU": 4, "reserved": 6}, {"GPU": 8, "preemptible": 4}])


def test_preemptible_instances_need_whole_instances_on_preemptible_nodes():
    # 3 GPUs hold one 2-GPU instance, not one and a half; the reserved node's GPUs do not count
    with pytest.raises(ConfigError, match=r"up to 4 preemptible instances of 2 GPUs .* hold 2"):
        check_cluster(PAPER, [{"GPU": 16, "reserved": 6}, {"GPU": 3, "preemptible": 1},
                              {"GPU": 3, "preemptible": 1}])
