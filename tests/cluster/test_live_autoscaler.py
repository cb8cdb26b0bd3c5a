"""A live run asks Ray's autoscaler for its preemptible target and gives it back: on Ray's
fake multi-node provider (a head of this test's own; no spot node at the start),
`rlboost train` with max_preemptible=2 gets 2 spot nodes launched by the autoscaler and
serves samples on both; when Ctrl-C stops the run its request is withdrawn and the
autoscaler scales the idle nodes down. Prints how long each took."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from live_cluster import FakeAutoscalingHead, autoscaler_round, connected, live_overrides, spot_nodes
from own_processes import jsonl


@pytest.mark.slow
def test_the_autoscaler_launches_the_run_s_spot_nodes_and_scales_them_down_after_it(tmp_path):
    head = FakeAutoscalingHead(Path(tempfile.mkdtemp(prefix="rlbas-")), max_workers=2)  # short: socket paths
    runs = tmp_path / "runs"
    try:
        head.start()
        with connected(head.address, head.token):
            assert spot_nodes() == []
            overrides = live_overrides(tmp_path / "n", steps=60, **{"cluster.max_preemptible": 2})
            got = autoscaler_round(head, runs, overrides, tmp_path / "cwd", count=2)
    finally:
        head.stop()
    assert got["code"] == 130, got["err"][-3000:]  # Ctrl-C: stopped after a checkpoint
    run = next(runs.iterdir())
    events = jsonl(run / "events.jsonl")
    capacity = next(e for e in events if e["kind"] == "capacity")
    assert capacity["nodes"] == 0 and capacity["requested"] == {"bundle": {"preemptible": 1.0}, "count": 2}
    served = {e["node"] for e in events if e["kind"] == "join" and e.get("node")}
    assert set(got["nodes"]) <= served  # the run placed an instance on each node the autoscaler launched
    for m in jsonl(run / "metrics.jsonl"):
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] and m["duplicates"] == 0
    print(f"\nautoscaler: 2 spot nodes {got['up_s']:.1f} s after the request, serving {got['served_s']:.1f} s after "
          f"it; both gone {got['down_s']:.1f} s after the run withdrew it (idle timeout "
          f"{head.config['idle_timeout_minutes'] * 60:.0f} s)")
