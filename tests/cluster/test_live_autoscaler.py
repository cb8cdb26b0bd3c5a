"""A live run asks Ray's autoscaler for its preemptible target and gives it back: on Ray's
fake multi-node provider (a head of this test's own; no spot node at the start),
`rlboost train` with max_preemptible=2 gets 2 spot nodes launched by the autoscaler and
serves samples on both; when Ctrl-C stops the run its request is withdrawn and the
autoscaler scales the idle nodes down. Prints how long each took."""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path

import pytest
from live_cluster import (
    Events,
    FakeAutoscalingHead,
    autoscaler_request,
    connected,
    live_overrides,
    spot_nodes,
    start_run,
    stop_run,
)
from own_processes import jsonl


def _until(probe, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s:g} s")
        time.sleep(0.1)
    return found


@pytest.mark.slow
def test_the_autoscaler_launches_the_run_s_spot_nodes_and_scales_them_down_after_it(tmp_path):
    head = FakeAutoscalingHead(Path(tempfile.mkdtemp(prefix="rlbas-")), max_workers=2)  # short: socket paths
    runs = tmp_path / "runs"
    try:
        head.start()
        with connected(head.address, head.token):
            assert spot_nodes() == []
            proc = start_run(head, runs, live_overrides(tmp_path / "n", steps=60, **{"cluster.max_preemptible": 2}),
                             tmp_path / "cwd")
            events = Events(runs)
            try:
                _until(lambda: autoscaler_request() == [{"preemptible": 1.0}] * 2, 400, "the run's request")
                asked = time.monotonic()
                nodes = _until(lambda: len(n := spot_nodes()) == 2 and n, 120, "2 spot nodes from the autoscaler")
                up_s = time.monotonic() - asked
                for node in nodes:
                    events.wait(events.on_node(node, "first_sample"), 120, f"a sample on node {node[:8]}")
            finally:
                proc.send_signal(signal.SIGINT)  # Ctrl-C: the step ends, then the run closes
            _until(lambda: autoscaler_request() == [], 300, "the request withdrawn")
            withdrawn = time.monotonic()
            _until(lambda: spot_nodes() == [], 180, "the spot nodes scaled down")
            down_s = time.monotonic() - withdrawn
            code, _, err = stop_run(proc, interrupted=True)
    finally:
        head.stop()
    assert code == 130, err[-3000:]
    run = next(runs.iterdir())
    capacity = next(e for e in jsonl(run / "events.jsonl") if e["kind"] == "capacity")
    assert capacity["nodes"] == 0 and capacity["requested"] == {"bundle": {"preemptible": 1.0}, "count": 2}
    for m in jsonl(run / "metrics.jsonl"):
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] and m["duplicates"] == 0
    print(f"\nautoscaler: 2 spot nodes {up_s:.1f} s after the request; both gone {down_s:.1f} s after the run "
          f"withdrew it (idle timeout {head.config['idle_timeout_minutes'] * 60:.0f} s)")
