"""The plain parts of live capacity, without a cluster: which nodes are preemptible and how
many instances each holds, which capacity a run gets, what a joined cluster must offer, and
what the summary and plots make of live events (how long the pool was empty, who sent each
notice)."""

from __future__ import annotations

import pytest

from rlboost.cluster.capacity import InstanceSlot, resolve_kind
from rlboost.cluster.capacity.nodes import PreemptibleNode, preemptible_nodes
from rlboost.cluster.notices.base import SOURCE_LABEL
from rlboost.cluster.session import RaySettings, check_resources
from rlboost.errors import ConfigError
from rlboost.run.report import _notice_sources, _pool_empty
from rlboost.run.timeline import read_timeline


def _node(node_id: str, alive: bool = True, **resources) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": resources, "Labels": {SOURCE_LABEL: "gcp"}}


def test_the_preemptible_nodes_are_the_alive_ones_with_the_resource_and_not_reserved():
    nodes = preemptible_nodes([_node("b", preemptible=2.0, GPU=4.0), _node("a", preemptible=1.0),
                               _node("c", alive=False, preemptible=1.0), _node("d", reserved=6.0, preemptible=1.0),
                               _node("e", CPU=8.0)])
    assert [n.node_id for n in nodes] == ["a", "b"]
    assert nodes[1].notice_source("auto") == "gcp"  # the node's label wins over the run's setting
    assert PreemptibleNode("x", {}, {SOURCE_LABEL: "ibm"}).notice_source("aws") == "aws"  # not a source: ignored


@pytest.mark.parametrize("resources, slot, fits", [
    ({"preemptible": 2.0, "GPU": 4.0}, InstanceSlot(gpus=2.0), 2),
    ({"preemptible": 4.0, "GPU": 4.0}, InstanceSlot(gpus=2.0), 2),  # GPUs run out first
    ({"preemptible": 1.0, "GPU": 1.0}, InstanceSlot(gpus=2.0), 0),  # too small for one instance
    ({"preemptible": 3.0, "CPU": 2.0}, InstanceSlot(cpus=1.0), 2),
    ({"preemptible": 2.0}, InstanceSlot(), 2),  # CPU tiny runs: one per unit
])
def test_a_node_holds_one_instance_per_unit_as_far_as_its_gpus_and_cpus_go(resources, slot, fits):
    assert PreemptibleNode("n", resources).slots(slot) == fits


def test_the_autoscaler_is_asked_for_what_one_instance_takes():
    assert InstanceSlot(cpus=4.0, gpus=2.0).bundle() == {"preemptible": 1.0, "CPU": 4.0, "GPU": 2.0}


def test_auto_capacity_is_live_on_a_joined_cluster_and_live_is_refused_on_a_local_one():
    assert resolve_kind("auto", joined=True) == "live" and resolve_kind("auto", joined=False) == "trace"
    assert resolve_kind("trace", joined=True) == "trace"
    with pytest.raises(ConfigError, match="cluster.capacity=live"):
        resolve_kind("live", joined=False)


def test_a_live_run_joins_a_cluster_without_preemptible_nodes_yet():
    check_resources({"reserved": 3.0}, RaySettings(reserved=3, preemptible_required=False))
    with pytest.raises(ConfigError, match="preemptible >= 1"):
        check_resources({"reserved": 3.0}, RaySettings(reserved=3))


def _ev(t: float, kind: str, up: int | None = None, **more) -> dict:
    return {"t": t, "kind": kind, **({"preemptible_up": up} if up is not None else {}), **more}


def test_the_summary_counts_the_time_without_any_preemptible_instance():
    events = [_ev(0.0, "launch"), _ev(1.0, "join", 0, pool="reserved"), _ev(10.0, "join", 1), _ev(30.0, "gone", 0),
              _ev(35.0, "join", 1), _ev(50.0, "gone", 0, reason="shutdown")]
    got = _pool_empty(events, end_s=45.0)  # the last step ended at 45 s; the shutdown comes after
    assert got == {"pool_empty_s": pytest.approx(10.0 + 5.0), "pool_span_s": pytest.approx(45.0)}
    relaunched = [*events[:3], _ev(20.0, "launch"), _ev(28.0, "join", 1)]  # a restart: no instance until 28 s
    assert _pool_empty(relaunched, end_s=40.0)["pool_empty_s"] == pytest.approx(10.0 + 8.0)


def test_notices_are_counted_by_who_sent_them_and_the_plot_says_so():
    events = [_ev(0.0, "launch"), _ev(1.0, "join", 1, instance="spot-a"), _ev(2.0, "join", 2, instance="spot-b"),
              _ev(3.0, "notice", 2, instance="spot-a", source="cloud", cloud="aws"),
              _ev(4.0, "notice", 2, instance="spot-b", source="hook"),
              _ev(5.0, "gone", 1, instance="spot-a", source="cloud", reason="reclaimed"),
              _ev(6.0, "death", 0, instance="spot-b", source="node", reason="lost")]
    assert _notice_sources(events) == (("aws", 1), ("hook", 1))
    marks = read_timeline([], events).marks
    assert [(m.kind, m.source) for m in marks] == [("notice", "aws"), ("notice", "hook"), ("sudden", "node")]
    assert marks[0].until_x is not None  # its grace period ends where it was reclaimed
