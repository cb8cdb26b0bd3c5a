"""The controller as a Ray actor driving emulated engines that are Ray actors themselves."""

import pytest
import ray
from controller_fakes import engine_config, uninterrupted

from rlboost.cluster.session import RaySession, RaySettings
from rlboost.controller.actor import RolloutController
from rlboost.controller.clock import MonotonicClock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import ReferenceWindowConfig
from rlboost.controller.records import InstanceInfo
from rlboost.errors import RolloutError
from rlboost.rollout.emulated.engine import KV_LAYOUT, EmulatedEngine
from rlboost.rollout.host import EngineHost
from rlboost.sim import make_groups
from rlboost.transfer import TransferConfig, new_secret


@pytest.fixture(scope="module")
def ray_session():
    # a local cluster of our own (tests/conftest.py may have one up for several modules)
    with RaySession(RaySettings(num_cpus=2, reserved=1, preemptible=0, object_store_mb=200)):
        yield


def test_a_step_over_ray_actors_survives_a_killed_instance(ray_session):
    # engines speak the handoff protocol: when the window closes, the reserved engine's
    # samples move to the spot actors with their KV pages, pulled actor to actor
    engine_actor = ray.remote(num_cpus=0)(EngineHost)
    ctl = RolloutController.remote(
        ControllerConfig(poll_interval_s=0.02, idle_timeout_s=30.0, call_timeout_s=10.0, migrate_with_kv=True),
        "reference", ReferenceWindowConfig(initial_window_s=0.2, floor_s=0.0))
    engines = {}
    transfer = TransferConfig(secret=new_secret())  # the run's secret: engines pull pages from each other
    config = engine_config(max_running=8, sample_tokens_per_s=20.0)
    for name, kind in (("reserved-0", "reserved"), ("spot-0", "preemptible"), ("spot-1", "preemptible")):
        engines[name] = engine_actor.remote(lambda: EmulatedEngine(config, clock=MonotonicClock()), transfer,
                                            handoff=True)
        ray.get(engines[name].engine_call.remote("load_weights", {}, 0))
        info = InstanceInfo(instance_id=name, kind=kind, capacity=8, kv_layout=KV_LAYOUT)
        lease = ray.get(ctl.register.remote(info, engines[name]))
        assert lease.state == "joining"
    groups = make_groups(0, num_groups=3, group_size=4, prompt_len=5, max_new_tokens=40)
    ray.get(ctl.set_weight_version.remote(0))
    ray.get(ctl.start_step.remote(0, groups, 0))
    while not ray.get(ctl.wait_window_closed.remote(10.0)):
        pass
    ray.kill(engines["spot-0"])  # sudden death in the middle of the step
    got = {}
    while True:
        mb = ray.get(ctl.next_microbatch.remote(10.0))
        if mb is None:
            continue
        for g in mb.groups:
            for s in g.samples:
                assert s.sample_id not in got
                got[s.sample_id] = (s.output_ids, s.output_logprobs, s.finish_reason)
        if mb.last:
            break
    metrics = ray.get(ctl.end_step.remote())
    assert got == uninterrupted(groups)
    assert metrics.deaths == 1 and metrics.samples == 12
    assert metrics.kv_migrations > 0  # the evacuated samples resumed from their pages
    states = {s.instance_id: s.state for s in ray.get(ctl.instances.remote())}
    assert states == {"reserved-0": "active", "spot-1": "active"}
    assert ray.get(ctl.notice.remote("spot-1", 30.0)) > 0
    with pytest.raises(RolloutError, match="start_step"):
        ray.get(ctl.next_microbatch.remote(0.1))
    ray.get(ctl.close.remote())
