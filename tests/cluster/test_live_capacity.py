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

import subprocess
import sys

import pytest
import ray
from fake_metadata import FakeAwsMetadataForTests, FakeGcpMetadataForTests
from live_cluster import Events, autoscaler_request, live_overrides, local_cluster, notice, run_env, start_run, stop_run
from own_processes import jsonl

from rlboost.config.overrides import apply_overrides
from rlboost.recipes import get_recipe


def _instance_events(events: list[dict], node: str) -> tuple[str, list[dict]]:
    iid = next(e["instance"] for e in events if e["kind"] == "join" and e.get("node") == node)
    return iid, [e for e in events if e.get("instance") == iid]


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


@pytest.fixture(scope="module")
def one_cluster(tmp_path_factory):
    """One token-authenticated cluster for the module's tests that need one (a start and stop
    is some 9 CPU-seconds on 2 cores). They come after the tests that need Ray down in this
    process."""
    with local_cluster(tmp_path_factory.mktemp("work")) as cluster:
        yield cluster


@pytest.fixture
def cluster(one_cluster):
    """The module's cluster, its head alone: the nodes a test added leave after it."""
    yield one_cluster
    for node in list(one_cluster.nodes):
        one_cluster.remove(node)


def test_a_driver_without_the_cluster_s_token_is_refused_in_one_line(cluster, tmp_path):
    env = dict(run_env(cluster, tmp_path / "runs"), HOME=str(tmp_path / "home"))  # no ~/.ray/auth_token
    del env["RAY_AUTH_TOKEN"]
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train",
                           *[a for o in [f"cluster.address={cluster.address}", *live_overrides(tmp_path / "n", 2)]
                             for a in ("--set", o)]],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "token authentication" in lines[-1] and "RAY_AUTH_MODE=token" in lines[-1], lines
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_live_nodes_join_are_drained_by_their_shutdown_hook_and_die_with_no_sample_lost(cluster, tmp_path):
    runs, hooks = tmp_path / "runs", tmp_path / "n"
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


@pytest.mark.slow
def test_two_nodes_join_one_dies_and_aws_and_gcp_notices_drain_theirs_before_the_deadline(cluster, tmp_path):
    """Two preemptible nodes join mid-run and serve; a third is removed mid-step; one of the
    two gets its notice from a fake AWS metadata server (IMDSv2 token, then instance-action),
    the other from a fake GCP one (instance/preempted). Each noticed node drains before its
    deadline, and no sample is lost or duplicated."""
    runs, hooks = tmp_path / "runs", tmp_path / "n"
    with FakeAwsMetadataForTests() as aws, FakeGcpMetadataForTests() as gcp:
        overrides = [*live_overrides(hooks, steps=80), f"cluster.notices.aws_url={aws.url}",
                     f"cluster.notices.gcp_url={gcp.url}", "cluster.notices.gcp_grace_s=20",
                     "controller.registry.drain_margin_s=10"]
        proc = start_run(cluster, runs, overrides, tmp_path / "cwd")
        events = Events(runs)
        try:
            events.wait(lambda e: events.steps_done() >= 1, 400, "the first step")
            nodes = {"aws": cluster.add("aws"), "gcp": cluster.add("gcp")}
            for node in nodes.values():
                events.wait(events.on_node(node, "first_sample"), 120, f"a sample on node {node[:8]}")
            doomed = cluster.add("none")
            events.wait(events.on_node(doomed, "first_sample"), 120, "a sample on the third node")
            cluster.remove(doomed)
            events.wait(events.on_node(doomed, "death"), 60, "the removed node's instance ended")
            aws.notify(20.0)
            gcp.notify(0.0)  # GCP's notice carries no time: cluster.notices.gcp_grace_s
            for node in nodes.values():
                events.wait(events.on_node(node, "gone"), 90, f"node {node[:8]} reclaimed")
        finally:
            code, _, err = stop_run(proc)
    assert code == 130, err[-3000:]
    run = next(runs.iterdir())
    log, metrics = jsonl(run / "events.jsonl"), jsonl(run / "metrics.jsonl")
    for m in metrics:
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == 32
        assert m["duplicates"] == 0 and m["gaps"] == 0
    for cloud, node in nodes.items():
        _, mine = _instance_events(log, node)
        assert [e["kind"] for e in mine] == ["join", "active", "first_sample", "notice", "drained", "gone"], mine
        notice_event, drained = mine[3], mine[4]
        assert notice_event["source"] == "cloud" and notice_event["cloud"] == cloud
        assert 10.0 < notice_event["grace_s"] <= 20.0 and drained["t"] < notice_event["t"] + notice_event["grace_s"]
    _, dead = _instance_events(log, doomed)
    assert [e["kind"] for e in dead] == ["join", "active", "first_sample", "death"]
    assert any(r[1] == "/latest/api/token" for r in aws.requests)  # IMDSv2: a session token first
    assert any("wait_for_change=true" in r[1] for r in gcp.requests)
    summary = (run / "summary.md").read_text()
    assert "| samples lost | 0 |" in summary and "| notices by source | 1 aws, 1 gcp |" in summary
