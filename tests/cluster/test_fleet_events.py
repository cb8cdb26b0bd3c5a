"""The controller owns each instance's lifecycle and pushes its events to the driver's fleet:
an instance's events arrive in order without anyone polling, each weight version reaches
the instances from the controller (the driver relays nothing), a controller that is slow
to answer holds up no join or notice, and an engine whose load fails reaches the driver
with its cause, in one line."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time

import pytest
import ray
import ray.cloudpickle
from fleet_lines import FleetLinesForTests

from rlboost.cluster.cost import CostLedger
from rlboost.cluster.fleet import Fleet
from rlboost.cluster.instance import InstanceSpec, RolloutInstance
from rlboost.cluster.session import RaySession, RaySettings, actor_options
from rlboost.controller.actor import ControllerActor, RolloutController
from rlboost.controller.config import ControllerConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.errors import InstanceFailed, StepFailed
from rlboost.migration.state import RequestState, SamplingParams
from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.embedded.engine import EmbeddedEngineConfig
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.run.outcome import RecoverableFailure, RestartsExhausted, ending_lines, recoverable
from rlboost.transfer import TransferConfig, WeightPublisher, new_secret

CONFIG = ControllerConfig(poll_interval_s=0.02, registry=RegistryConfig(heartbeat_interval_s=0.5, missed_beats=20,
                                                                        drain_margin_s=0.2))


@pytest.fixture(scope="module")
def ray_cluster():
    with RaySession(RaySettings(num_cpus=2, reserved=2, preemptible=4, object_store_mb=128)):
        yield


# Ray's workers cannot import a test module: its actor classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
class HeldControllerForTests(ControllerActor):
    """The real controller, except that it answers place() and notice() only once release()
    is called: a controller too busy to answer the driver."""

    def __init__(self, config):
        super().__init__(config, "reference")
        self._held = asyncio.Event()

    async def release(self):
        self._held.set()

    async def place(self, instance_id, kind, details=None):
        await self._held.wait()
        super().place(instance_id, kind, details)

    async def notice(self, instance_id, grace_s, details=None):
        await self._held.wait()
        return super().notice(instance_id, grace_s, details)


@contextlib.contextmanager
def fleet_of(ctl, ckpt, published, lines):
    """Version 1 (`published`) served and made current; a fleet of instances shaped like
    `ckpt`; everything closed after."""
    transfer = TransferConfig(secret=new_secret())
    with WeightPublisher(transfer) as pub:
        pub.publish(1, published)
        ray.get(ctl.set_weight_version.remote(1))
        template = InstanceSpec(instance_id="t", kind="preemptible", transfer=transfer, model_dir=str(ckpt),
                                rollout=RolloutConfig(capacity=4, embedded=EmbeddedEngineConfig(num_blocks=64)),
                                sources=(pub.address,))
        fleet = Fleet(ctl, template, lambda kind: actor_options(kind), CostLedger(), lines, lambda: 0.0)
        try:
            yield fleet, pub
        finally:
            fleet.close()
            ray.get(ctl.close.remote())
            ray.kill(ctl)


def test_an_instance_s_events_arrive_in_order_and_versions_reach_it_from_the_controller(ray_cluster, tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=3)
    weights = load_pretrained(ckpt).named_weights()
    ctl = RolloutController.remote(CONFIG, "reference")
    lines = FleetLinesForTests()
    with fleet_of(ctl, ckpt, weights, lines) as (fleet, pub):
        fleet.join("spot-0")
        fleet.wait_version(1, "preemptible", 120)
        pub.publish(2, {n: t + 1.0 for n, t in weights.items()})
        ray.get(ctl.set_weight_version.remote(2))  # nothing else: no nudge, no peers from the driver
        fleet.wait_version(2, "preemptible", 120)
        assert [p.version for p in fleet.pull_records(2)] == [2]
        fleet.notice("spot-0", 1.0)
        lines.wait("gone", "spot-0")
        assert [e["kind"] for e in lines.of("spot-0")] == ["join", "active", "notice", "drained", "gone"]
        assert lines.of("spot-0", "gone")[0]["reason"] == "reclaimed" and fleet.up() == 0
        assert all(e["source"] == "trace" for e in lines.of("spot-0") if "source" in e)


def test_a_controller_slow_to_answer_holds_up_no_join_and_no_notice(ray_cluster, tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=4)
    ctl = HeldControllerForTests.remote(CONFIG)
    lines = FleetLinesForTests()
    with fleet_of(ctl, ckpt, load_pretrained(ckpt).named_weights(), lines) as (fleet, _):
        # the controller answers neither the placement nor the notice until released: both
        # calls return anyway, and the instance starts and registers on its own meanwhile
        fleet.join("spot-0")
        fleet.join("spot-1")
        first = ray.get(ctl.next_events.remote(0, 120.0))
        assert first and first[0].kind == "join"
        fleet.notice("spot-0", 60.0)
        assert fleet.up() == 2 and fleet.oldest() == "spot-1"
        ray.get(ctl.release.remote())
        lines.wait("notice", "spot-0")
        fleet.wait_version(1, "preemptible", 120)  # spot-1 (spot-0 is under notice)
        kinds = [e["kind"] for e in lines.of("spot-0")]
        assert kinds[0] == "join" and "notice" in kinds and kinds.count("join") == 1


def test_an_engine_whose_load_fails_reaches_the_driver_with_its_cause(ray_cluster, tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=5)
    other = build_tiny_checkpoint(tmp_path / "wide", arch="qwen3", seed=5, hidden_size=96)
    ctl = RolloutController.remote(CONFIG, "reference")
    lines = FleetLinesForTests()
    # the trainer serves weights of another shape than the engine's model: its load raises
    with fleet_of(ctl, ckpt, load_pretrained(other).named_weights(), lines) as (fleet, _):
        fleet.join("reserved-0", "reserved")
        with pytest.raises(InstanceFailed, match="reserved instance reserved-0: its engine failed to load weight "
                                                 "version 1: ") as failed:
            fleet.wait_version(1, "reserved", 30)  # within 30 s, or a TimeoutError fails the test
        (death,) = lines.of("reserved-0", "death")
        assert death["reason"] == "failed" and death["cause"] in str(failed.value)
        assert "\n" not in str(failed.value)
        assert fleet.up("reserved") == 0  # not restarted in place: the run restarts, as for other failures


def _loaded(ctl, instance_id, version, timeout_s):
    """Whether the controller reports the instance holding `version` within timeout_s (its
    event stream, long-polled: no sleeping)."""
    seq, deadline = 0, time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        for e in ray.get(ctl.next_events.remote(seq, left)):
            seq = e.seq
            if e.instance_id == instance_id and e.kind in ("loaded", "lost", "death", "gone"):
                if e.kind != "loaded":
                    return False
                if e.details.get("weight_version") == version:
                    return True
    return False


def test_a_pulled_version_waits_for_samples_the_engine_still_holds_and_loads_once_they_leave(ray_cluster, tmp_path):
    """Samples the controller sent just before a publish can still be in the engine when the
    new version has been pulled (done, not yet collected: an emulated or server engine keeps
    them until polled). The instance loads once they have left, instead of failing as an
    engine that cannot load."""
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", seed=6)
    weights = load_pretrained(ckpt).named_weights()
    # a round a minute: the controller collects nothing from the engine while the test looks
    ctl = RolloutController.remote(dataclasses.replace(CONFIG, poll_interval_s=60.0), "reference")
    transfer = TransferConfig(secret=new_secret())
    fast = EmulatedEngineConfig(sample_tokens_per_s=1e6, decode_tokens_per_s=1e6, startup_s=0.0)
    with WeightPublisher(transfer) as pub:
        pub.publish(1, weights)
        ray.get(ctl.set_weight_version.remote(1))
        spec = InstanceSpec(instance_id="spot-0", kind="preemptible", transfer=transfer, model_dir=str(ckpt),
                            rollout=RolloutConfig(backend="emulated", capacity=4, emulated=fast),
                            sources=(pub.address,))
        ray.get(ctl.place.remote("spot-0", "preemptible", {"source": "trace"}))
        instance = ray.remote(RolloutInstance).options(**actor_options("preemptible")).remote(spec, ctl)
        try:
            ray.get(instance.ready.remote())
            assert _loaded(ctl, "spot-0", 1, 60)
            state = RequestState(sample_id=7, prompt_ids=(1, 2, 3), params=SamplingParams(max_new_tokens=2), seed=0,
                                 weight_version=1)
            ray.get(instance.engine_call.remote("submit", [state]))
            load = ray.get(instance.engine_call.remote("load"))
            assert load.running + load.queued == 0  # done at once, and still held until polled
            pub.publish(2, {n: t + 1.0 for n, t in weights.items()})
            ray.get(ctl.set_weight_version.remote(2))
            assert not _loaded(ctl, "spot-0", 2, 3.0)  # pulled (a tiny model: milliseconds), not loaded, alive
            assert ray.get(instance.engine_call.remote("load")).weight_version == 1
            deltas = ray.get(instance.engine_call.remote("poll", 0.0))  # what the controller's next round does
            assert [d.sample_id for d in deltas if d.finish_reason] == [7]
            assert _loaded(ctl, "spot-0", 2, 30)
        finally:
            ray.kill(instance)
            ray.get(ctl.close.remote())
            ray.kill(ctl)


def test_a_failed_reserved_engine_ends_the_run_with_one_line():
    failure = InstanceFailed("reserved instance reserved-0: its engine failed to load weight version 1: "
                             "RolloutError: size mismatch for model.embed_tokens.weight")
    assert isinstance(failure, StepFailed)  # restarted by run.max_restarts, as other failed steps are
    headline = recoverable(failure, [], step=1)
    assert headline.startswith("step 1 failed: InstanceFailed: reserved instance reserved-0: its engine failed")
    halted = RecoverableFailure(headline, step=1, run_dir="/runs/r", resume_from=None)
    (line,) = ending_lines(RestartsExhausted(halted, 0, 0))
    assert "reserved-0" in line and "size mismatch" in line and "\n" not in line
