"""Live capacity on a multi-node Ray cluster of this machine (Ray's own
ray.cluster_utils.Cluster): `rlboost train --set cluster.capacity=live` of the tiny model
(emulated engines, a few seconds per sample) while preemptible raylets join and leave.
A node that joins mid-run gets an instance that serves samples; `rlboost notice --grace
20 --wait`, run as a node's shutdown hook runs it, drains that node within the grace; a
node removed mid-step ends its instance as a death whose samples resume elsewhere; the
autoscaler's request stands while the run runs and is withdrawn when Ctrl-C stops it. No
sample is lost or duplicated in any step. The run joins with Ray's token authentication,
which rlboost turns on by itself (the test gives only the cluster's token).

The run's metadata URLs all point at closed loopback ports (tests/live_cluster.py), so its notice
agents probe nothing outside this machine.
"""

from __future__ import annotations

import pytest
import ray
from live_cluster import Events, autoscaler_request, live_overrides, local_cluster, notice, start_run, stop_run
from own_processes import jsonl

from rlboost.config.overrides import apply_overrides
from rlboost.recipes import get_recipe


def _instance_events(events: list[dict], node: str) -> tuple[str, list[dict]]:
    iid = next(e["instance"] for e in events if e["kind"] == "join" and e.get("node") == node)
    return iid, [e for e in events if e.get("instance") == iid]


def test_live_nodes_join_are_drained_by_their_shutdown_hook_and_die_with_no_sample_lost(tmp_path):
    runs, hooks = tmp_path / "runs", tmp_path / "n"
    with local_cluster(tmp_path / "work") as cluster:
        overrides = [*live_overrides(hooks, steps=60), "controller.registry.drain_margin_s=15"]  # 20 s notice: drain after 5
        proc = start_run(cluster, runs, overrides, tmp_path / "cwd")
        events = Events(runs)
        try:
            events.wait(lambda e: e["kind"] == "capacity", 400, "the live capacity's start")
            requested = autoscaler_request()
            a = cluster.add()
            events.wait(events.on_node(a, "first_sample"), 120, "a first sample on the node that joined")
            hook = notice(hooks, 20.0, wait=True)  # returns once the node has drained
            b = cluster.add()
            events.wait(events.on_node(b, "first_sample"), 120, "a first sample on the second node")
            cluster.remove(b)  # mid-step: it holds samples
            events.wait(events.on_node(b, "death"), 60, "the removed node's instance ended")
            events.wait(events.on_node(a, "gone"), 60, "the noticed node's instance reclaimed at its deadline")
        finally:  # the step in progress (with the dead node's samples resumed) completes first
            code, out, err = stop_run(proc)
        assert autoscaler_request() == []  # withdrawn when Ctrl-C stopped the run
    assert code == 130, err[-3000:]  # stopped by Ctrl-C after a checkpoint
    assert requested == [{"preemptible": 1.0}] * 3  # max_preemptible bundles while it ran
    assert hook.returncode == 0, hook.stderr
    assert "the run took the notice" in hook.stdout and "drained after" in hook.stdout, hook.stdout

    run = next(runs.iterdir())
    events, metrics = jsonl(run / "events.jsonl"), jsonl(run / "metrics.jsonl")
    for m in metrics:  # every sample of every step trained on exactly once
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == 32
        assert m["duplicates"] == 0 and m["gaps"] == 0 and m["sample_versions"] == [m["step"]]
    _, on_a = _instance_events(events, a)
    assert [e["kind"] for e in on_a] == ["join", "active", "first_sample", "notice", "drained", "gone"], on_a
    notice_event, drained, gone = on_a[3], on_a[4], on_a[5]
    assert on_a[0]["source"] == "node" and notice_event["source"] == drained["source"] == gone["source"] == "hook"
    assert notice_event["grace_s"] <= 20.0 and drained["t"] < notice_event["t"] + notice_event["grace_s"]
    assert gone["reason"] == "reclaimed"
    _, on_b = _instance_events(events, b)
    assert [e["kind"] for e in on_b] == ["join", "active", "first_sample", "death"], on_b
    assert on_b[-1]["reason"] == "lost" and on_b[-1]["source"] == "node"
    nodes = [(e["action"], e["node"]) for e in events if e["kind"] == "node"]
    assert {("joined", a), ("noticed", a), ("drained", a), ("joined", b), ("left", b)} <= set(nodes)
    summary = (run / "summary.md").read_text()
    assert "| samples lost | 0 |" in summary and "| samples duplicated | 0 |" in summary
    assert "| notices by source | 1 hook |" in summary and "| preemptible pool empty |" in summary


def test_live_capacity_on_a_local_cluster_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from rlboost.cli import main

    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path))
    monkeypatch.delenv("RLBOOST_RAY_ADDRESS", raising=False)
    assert main(["train", "--set", "cluster.capacity=live"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster.capacity=live" in err[0] and "cluster.address" in err[0]
    assert not any(tmp_path.iterdir()) and not ray.is_initialized()


@pytest.mark.parametrize("value", ["cloud", "", "AWS"])
def test_a_notice_source_that_is_none_of_them_is_refused_by_name(value):
    with pytest.raises(ValueError, match="cluster.notice_source|notice_source"):
        apply_overrides(get_recipe("tiny_cpu"), [f"cluster.notice_source={value}"])
