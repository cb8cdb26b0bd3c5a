"""The paper table's staleness rows run: each row's config carries its bound and instance
count, and a short simulation of it, under either schedule, finishes with every trained
token within the bound (the simulator refuses any other) and some of them a version old.
No timings are asserted (they are bench/paper_table.py's)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "paper_table.py"


def _table():
    spec = importlib.util.spec_from_file_location("paper_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(steps: int) -> argparse.Namespace:
    return argparse.Namespace(on_demand_node_usd_h=83.79, spot_node_usd_h=21.28, instance_share=0.25, steps=steps,
                              trace="aws-spot-4node", set=["task.groups_per_step=8"])


def test_the_staleness_rows_are_named_and_configured():
    table = _table()
    assert len(table.STALENESS_ROWS) == 16
    config = table.row_config("after rollout, staleness 2, 3 inst.", _args(4))
    assert config.controller.max_staleness == 2 and config.cluster.max_preemptible == 3
    assert table.staleness_rows((4,)) == ("reserved only", "rlboost, 4 instances", "rlboost, staleness 1, 4 inst.",
                                          "rlboost, staleness 2, 4 inst.", "after rollout, staleness 1, 4 inst.",
                                          "after rollout, staleness 2, 4 inst.")


@pytest.mark.parametrize("lookahead", ["after_rollout", "free_slots"])
def test_a_short_staleness_1_row_finishes_within_the_bound(lookahead):
    table = _table()
    fig = table.simulated(table.row_config("rlboost, staleness 1, 4 inst.", _args(4)), 1, lookahead=lookahead)
    assert fig["tokens_per_s"] > 0
    assert 0 < fig["stale_share"] <= 1  # tokens one version old were trained, none older (refused otherwise)
