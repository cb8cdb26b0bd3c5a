"""Rollout instances as Ray actors: they register with the controller, pull each published
version through the transfer core before sampling, generate with exactly those weights,
and are preempted with a notice or suddenly, every event recorded."""

from __future__ import annotations

import contextlib
import sys

import pytest
import ray
import ray.cloudpickle
import torch
from fleet_lines import FleetLinesForTests
from own_processes import wait_until

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.fleet import Fleet
from rlboost.cluster.instance import InstanceSpec
from rlboost.cluster.session import RaySession, RaySettings, actor_options
from rlboost.controller.actor import ControllerActor, RolloutController
from rlboost.controller.clock import MonotonicClock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.records import PromptGroup
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.service import RolloutService
from rlboost.migration.state import SamplingParams
from rlboost.models import ByteTokenizer, build_tiny_checkpoint, load_pretrained
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.transfer import TransferConfig, WeightPublisher, new_secret

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def ray_cluster():
    with RaySession(RaySettings(num_cpus=2, reserved=2, preemptible=4, object_store_mb=128)):
        yield


def _groups(step, prompts, params=None):
    params = params or SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(TOK.eos_id,))
    return [PromptGroup(group_id=step * 100 + i, prompt_ids=tuple(p), num_samples=2, seed=7, params=params)
            for i, p in enumerate(prompts)]


def _rollout(ctl, step, version, prompts, params=None, metrics=None):
    """One step through the controller; every sample must come from `version`."""
    ray.get(ctl.start_step.remote(step, _groups(step, prompts, params), version))
    while not ray.get(ctl.wait_window_closed.remote(5.0)):
        pass
    out = {}
    while True:
        mb = ray.get(ctl.next_microbatch.remote(5.0))
        for g in (mb.groups if mb is not None else ()):
            for s in g.samples:
                assert s.weight_version == version
                out[s.sample_id] = s.output_ids
        if mb is not None and mb.last:
            break
    done = ray.get(ctl.end_step.remote())
    if metrics is not None:
        metrics.append(done)
    return out


def _reference(model_dir, weights, step, prompts, params=None):
    """What an in-process engine holding `weights` generates for the same groups."""
    with EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(model_dir))) as engine:
        engine.load_weights(weights, 5)
        states = [s for g in _groups(step, prompts, params) for s in g.states(5)]
        engine.submit(states)
        out, done = {s.sample_id: () for s in states}, set()
        while len(done) < len(states):
            for d in engine.poll(5.0):
                out[d.sample_id] += d.ids
                if d.finish_reason:
                    done.add(d.sample_id)
        return out


@contextlib.contextmanager
def _fleet(ctl, ckpt, weights, ledger, rec, now):
    """Version 1 published and a fleet of no instances; closes all."""
    transfer = TransferConfig(secret=new_secret())  # the run's secret, shared with its instances
    with WeightPublisher(transfer) as pub:
        pub.publish(1, weights)
        ray.get(ctl.set_weight_version.remote(1))
        template = InstanceSpec(instance_id="t", kind="preemptible", transfer=transfer, model_dir=str(ckpt),
                                rollout=RolloutConfig(capacity=4, embedded=EmbeddedEngineConfig(num_blocks=96)),  # 4 x 305 tokens fit
                                sources=(pub.address,))
        fleet = Fleet(ctl, template, lambda kind: actor_options(kind), ledger, rec, now)
        try:
            yield fleet, pub
        finally:
            fleet.close()
            ray.get(ctl.close.remote())
            ray.kill(ctl)


@contextlib.contextmanager
def _running_fleet(ctl, ckpt, weights, ledger, rec, now):
    """Version 1 published, a reserved and a preemptible instance up at it; closes all."""
    with _fleet(ctl, ckpt, weights, ledger, rec, now) as (fleet, pub):
        fleet.join("reserved-0", "reserved")
        fleet.join("spot-0")
        fleet.wait_version(1, "reserved", 120)
        fleet.wait_version(1, "preemptible", 120)
        yield fleet, pub


def test_instances_pull_each_version_generate_with_it_and_get_preempted(ray_cluster, tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=3)
    weights = load_pretrained(ckpt).named_weights()
    prompts = [TOK.encode("1+2=", add_bos=True), TOK.encode("7+5=", add_bos=True)]
    ctl = RolloutController.options(num_cpus=0).remote(ControllerConfig(
        poll_interval_s=0.02, registry=RegistryConfig(heartbeat_interval_s=0.5, missed_beats=10,
                                                      drain_margin_s=0.2)), "reference")
    rec, ledger, clock = FleetLinesForTests(), CostLedger(), [0.0]
    with _running_fleet(ctl, ckpt, weights, ledger, rec, lambda: clock[0]) as (fleet, pub):
        # a joined instance starts empty and pulls before its first sample: what it
        # generates is what the published weights generate
        assert _rollout(ctl, 1, 1, prompts) == _reference(ckpt, weights, 1, prompts)

        changed = {n: t + 0.05 * torch.randn_like(t) for n, t in weights.items()}
        pub.publish(2, changed)
        ray.get(ctl.set_weight_version.remote(2))  # the controller tells the instances; the driver relays nothing
        fleet.wait_version(2, "reserved", 60)
        fleet.wait_version(2, "preemptible", 60)
        # pull records are asked only of started instances: both report once started
        pulls = wait_until(lambda: len(r := fleet.pull_records(2)) == 2 and r, 60, "both pull records")
        assert {p.instance_id for p in pulls} == {"reserved-0", "spot-0"}
        assert all(p.nbytes >= sum(t.numel() * 4 for t in weights.values()) for p in pulls)
        assert _rollout(ctl, 2, 2, prompts) == _reference(ckpt, changed, 2, prompts)

        clock[0] = 10.0
        fleet.notice("spot-0", 0.3)
        rec.wait("gone", "spot-0")
        # preempted the moment the controller has it active: its activation is still
        # recorded first (the controller's events arrive in the order they happened)
        fleet.join("spot-1")
        fleet.wait_version(2, "preemptible", 60)
        fleet.notice("spot-1", 0.3)
        rec.wait("gone", "spot-1")
        fleet.join("spot-2")
        fleet.wait_version(2, "preemptible", 60)
        clock[0] = 20.0
        fleet.kill("spot-2")
        rec.wait("death", "spot-2")
        assert fleet.up() == 0 and fleet.preemptions == {"notice": 2, "sudden": 1}
        for iid, end in (("spot-0", "gone"), ("spot-1", "gone"), ("spot-2", "death")):
            mine = [e["kind"] for e in rec.lines if e["instance"] == iid]
            # first_sample when the controller had samples on it; drained once its samples left
            core = [k for k in mine if k not in ("first_sample", "drained")]
            assert core == ["join", "active"] + (["notice"] if end == "gone" else []) + [end], (iid, mine)
            assert "drained" not in mine or mine.index("drained") == len(mine) - 2, mine
            assert "first_sample" not in mine or mine.index("first_sample") > mine.index("active"), mine
        assert all(e["pool"] in ("reserved", "preemptible") and e["preemptible_up"] <= 1 and e["reserved_up"] == 1
                   for e in rec.lines)
        assert [e["reason"] for e in rec.lines if e["kind"] == "gone"] == ["reclaimed", "reclaimed"]
        # preemptible instances bill from join to their end; the reserved engine is
        # part of the reserved cluster, which the launcher bills as a whole
        assert ledger.running() == {}
        assert ledger.summary(at_s=20.0).preemptible_s == pytest.approx(20.0)


class TokenGatedWindowForTests:
    """A local window that closes once the step has collected `tokens` tokens, rather than
    after a time: the reserved instance then holds unfinished samples however loaded the
    machine is (a window of 0.2 s could close before its first sample was placed)."""

    def __init__(self, tokens: int):
        self.tokens = tokens

    def plan(self, ctx) -> float:
        return 0.0

    def should_close(self, ctx) -> bool:
        # both kinds measured (the reserved instance has prefilled and decoded, so its samples
        # hold KV pages to move; on a loaded machine the preemptible one alone could reach the
        # token count first, and the reserved samples would move without pages)
        return ctx.local_tokens_per_s > 0 and ctx.remote_tokens_per_s > 0 and ctx.generated_tokens >= self.tokens

    def observe(self, obs) -> None:
        pass


# Ray's workers cannot import a test module: its actor classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
class TokenGatedControllerForTests(ControllerActor):
    """The real controller with TokenGatedWindowForTests as its offload policy."""

    def __init__(self, config: ControllerConfig, tokens: int):
        RolloutService.__init__(self, config, clock=MonotonicClock(), window_policy=TokenGatedWindowForTests(tokens))
        self.start_now()


def test_samples_leave_the_reserved_instance_with_their_kv_pages(ray_cluster, tmp_path):
    """migrate_with_kv (the recipes' setting) between instance actors: when the local window
    closes, the reserved instance's unfinished samples go to the preemptible one together
    with their KV pages (pulled instance to instance) and continue exactly as if they had
    never moved."""
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=4)
    weights = load_pretrained(ckpt).named_weights()
    prompts = [TOK.encode("3+4=", add_bos=True), TOK.encode("9+9=", add_bos=True)]
    # outlives the window, which closes once 8 of the step's 1200 tokens are collected
    long = SamplingParams(temperature=0.0, max_new_tokens=300, stop_token_ids=())
    ctl = TokenGatedControllerForTests.remote(
        ControllerConfig(poll_interval_s=0.02, migrate_with_kv=True,
                         registry=RegistryConfig(heartbeat_interval_s=0.5, missed_beats=20)), 8)
    rec, ledger = FleetLinesForTests(), CostLedger()
    with _running_fleet(ctl, ckpt, weights, ledger, rec, lambda: 0.0) as (fleet, pub):
        metrics = []
        out = _rollout(ctl, 1, 1, prompts, long, metrics)
        m = metrics[0]
        assert m.kv_migrations > 0 and m.samples == 4, (m.tokens_per_instance, m.migrations, m.migrated_tokens,
                                                         m.reprefill_tokens, m.resumes, m.window_s)
        assert dict(metrics[0].tokens_per_instance).get("spot-0", 0) > 0
        assert out == _reference(ckpt, weights, 1, prompts, long)
        assert all(len(ids) == 300 for ids in out.values())


def test_an_instance_a_wait_reports_active_has_its_active_event_already(ray_cluster, tmp_path):
    """wait_version returns once the events it waited on are recorded, so a preemption right
    after it follows the instance's activation in the event log: join, active, death."""
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=5)
    weights = load_pretrained(ckpt).named_weights()
    ctl = RolloutController.options(num_cpus=0).remote(ControllerConfig(poll_interval_s=0.02), "reference")
    rec = FleetLinesForTests()
    with _fleet(ctl, ckpt, weights, CostLedger(), rec, lambda: 0.0) as (fleet, _):
        fleet.join("spot-0")
        fleet.wait_version(1, "preemptible", 120)
        assert [e["kind"] for e in rec.lines] == ["join", "active"]
        fleet.kill("spot-0")
        rec.wait("death", "spot-0")
        assert [e["kind"] for e in rec.lines] == ["join", "active", "death"]
        assert rec.lines[1]["preemptible_up"] == 1 and rec.lines[2]["preemptible_up"] == 0


def test_a_local_cluster_s_one_node_takes_the_controller_as_the_trainer_ranks_start(ray_cluster, monkeypatch):
    """A local cluster has one node, and every actor of the run goes there: the controller
    starts on it beside the trainer ranks. A run that joins a cluster learns rank 0's node
    only once rank 0 is placed, and starts the controller there after it."""
    from rlboost.config.overrides import apply_overrides
    from rlboost.recipes import get_recipe
    from rlboost.run.launch import only_node

    monkeypatch.delenv("RLBOOST_RAY_ADDRESS", raising=False)
    config = get_recipe("tiny_cpu")
    assert only_node(config) == ray.get_runtime_context().get_node_id()
    joining = apply_overrides(config, ["cluster.address=127.0.0.1:6379", "transfer.bind_host=0.0.0.0",
                                       "trainer.rendezvous=tcp"])  # what a run that joins a cluster needs
    assert only_node(joining) is None
