"""The environment host as a Ray actor on a cluster of a reserved head and a preemptible node:
it goes on the head, never the preemptible node, and executes each tool call once across
processes, for a duplicate sent while the call executes and for a turn re-sent by the engine a
sample migrated to. Deterministic: the execution is held by a gate actor until the duplicate
has been sent; whether the duplicate reaches the host before the gate opens (and waits for
the execution) or after (and reads the record) is Ray's to decide, and either way it is
answered without executing (test_host.py holds the wait itself in one process)."""

from __future__ import annotations

from pathlib import Path

import envs_for_tests
import pytest
import ray
from envs_for_tests import GateForTests
from live_cluster import local_cluster
from ray import cloudpickle

from rlboost.cluster.environment_host import environment_node, start_environment_host
from rlboost.environments import EnvironmentConfig, ModelTurn, ToolCall, call_id
from rlboost.errors import ConfigError
from rlboost.tasks.base import Problem

ENVS = Path(__file__).parent / "envs_for_tests.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cloudpickle.register_pickle_by_value(envs_for_tests)  # the gate actor's class goes to Ray's workers whole
    with local_cluster(tmp_path_factory.mktemp("ray"), reserved=1) as c:
        c.spot = c.add(preemptible=1, cpus=1)
        yield c


def _node_of(actor) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=120)


def _call(sample: int, turn: int, text: str = "go") -> ToolCall:
    return ToolCall(sample_id=sample, turn=turn, call_id=call_id(sample, turn),
                    model_turn=ModelTurn(text=text, token_ids=(1, 2, 3)))


def test_the_host_goes_on_a_node_that_is_not_preemptible(cluster):
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("reserved"))
    assert environment_node(ray.nodes()) == head
    with pytest.raises(ConfigError, match="all 1 alive nodes are preemptible"):
        environment_node([n for n in ray.nodes() if n["NodeID"] == cluster.spot])
    host = start_environment_host(EnvironmentConfig(name="calculator"))
    try:
        assert _node_of(host) == head != cluster.spot
    finally:
        ray.kill(host)


def test_each_call_executes_once_across_processes_through_duplicates_and_a_migration(cluster):
    gate = ray.remote(GateForTests).options(name="gate-duplicates", num_cpus=0).remote()
    host = start_environment_host(EnvironmentConfig(name=f"{ENVS}:EchoEnvForTests",
                                                    options={"gate_actor": "gate-duplicates"}))
    try:
        opening = ray.get(host.reset.remote(9, Problem(problem_id=9, prompt="p9", answer="0")), timeout=120)
        first = host.step.remote(_call(9, 0))  # the engine that held the sample
        ray.get(gate.entered.remote(1), timeout=120)  # ... its call is executing, held at the gate
        duplicate = host.step.remote(_call(9, 0))  # a second engine re-sends the same turn
        ray.get(gate.open.remote(), timeout=120)
        replies = ray.get([first, duplicate], timeout=120)
        after = ray.get(host.step.remote(_call(9, 0)), timeout=120)  # and once more after the migration
        final = ray.get(host.step.remote(_call(9, 1, "done")), timeout=120)
        stats = ray.get(host.stats.remote(), timeout=120)
        entered = ray.get(gate.entered.remote(1), timeout=120)
    finally:
        ray.kill(host)
        ray.kill(gate)
    assert opening.text == "start p9"
    assert [r.replayed for r in replies] == [False, True] and replies[0].record == replies[1].record == after.record
    assert after.replayed and final.record.result.done and final.record.result.reward == 1.0
    assert (stats.executions, stats.executions_by_sample, stats.joined + stats.replays) == (2, {9: 2}, 2)
    assert entered == 1  # the environment stepped into turn 0 once
