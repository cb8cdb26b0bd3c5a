"""Property: under any schedule of joins, notices, deaths and slowdowns, every sample of every
step completes exactly once with the tokens an uninterrupted run produces, and no step hangs."""

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller_fakes import engine_config, outputs, uninterrupted
from rlboost.controller.clock import run_virtual
from rlboost.controller.emulation import EmulatedFleet, FleetEvent, InstanceSpec, make_groups
from rlboost.controller.offload import (AdaptiveWindow, AdaptiveWindowConfig, ReferenceWindowConfig,
                                        ReferenceWindowRule)
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import RouterConfig
from rlboost.controller.service import ControllerConfig, RolloutService

WATCHDOG_S = 5000.0  # virtual seconds; a schedule taking longer is a hang


@st.composite
def instance_specs(draw, name, kind="preemptible"):
    return InstanceSpec(
        instance_id=name, kind=kind, pull_s=0.0 if kind == "reserved" else draw(st.floats(0.0, 3.0)),
        engine=engine_config(max_running=draw(st.integers(1, 8)),
                             sample_tokens_per_s=draw(st.floats(2.0, 40.0)),
                             decode_tokens_per_s=draw(st.floats(10.0, 200.0))))


@st.composite
def schedules(draw):
    initial = [draw(instance_specs(f"spot-{i}")) for i in range(draw(st.integers(0, 3)))]
    names = [s.instance_id for s in initial]
    events = []
    for k in range(draw(st.integers(0, 8))):
        at = draw(st.floats(0.0, 12.0))
        kind = draw(st.sampled_from(["join", "notice", "death", "speed"] if names else ["join"]))
        if kind == "join":
            spec = draw(instance_specs(f"late-{k}"))
            names.append(spec.instance_id)
            events.append(FleetEvent(at_s=at, kind="join", instance_id=spec.instance_id, spec=spec))
        else:
            events.append(FleetEvent(at_s=at, kind=kind, instance_id=draw(st.sampled_from(names)),
                                     grace_s=draw(st.floats(0.0, 4.0)), factor=draw(st.floats(0.1, 3.0))))
    return initial, events


def run_schedule(reserved, initial, events, policy, shape, steps=2):
    groups_for = {s: make_groups(s, **shape) for s in range(steps)}

    async def main(clock):
        cfg = ControllerConfig(poll_interval_s=0.1, idle_timeout_s=60.0, call_timeout_s=2.0,
                               router=RouterConfig(retry_budget=20, min_steal_gain_s=0.5),
                               registry=RegistryConfig(heartbeat_interval_s=0.5, drain_margin_s=1.0))
        svc = RolloutService(cfg, clock=clock, window_policy=policy)
        await svc.start()
        fleet = EmulatedFleet(svc, clock)
        fleet.spawn(reserved)
        for spec in initial:
            fleet.spawn(spec)
        fleet.schedule(events)
        results = []
        try:
            for step in range(steps):
                svc.set_weight_version(step)
                svc.start_step(step, groups_for[step], step)
                batches = []
                while not batches or not batches[-1].last:
                    mb = await svc.next_microbatch(30.0)
                    if mb is not None:
                        batches.append(mb)
                results.append((batches, await svc.end_step()))
        finally:
            await fleet.close()
            await svc.close()
        return results

    async def guarded(clock):
        return await asyncio.wait_for(main(clock), WATCHDOG_S)
    return groups_for, run_virtual(guarded)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reserved=instance_specs("reserved-0", kind="reserved"), schedule=schedules(),
       adaptive=st.booleans(), window_s=st.floats(0.0, 6.0),
       shape=st.fixed_dictionaries(dict(num_groups=st.integers(1, 4), group_size=st.integers(1, 4),
                                        prompt_len=st.integers(1, 6), max_new_tokens=st.integers(1, 50),
                                        seed=st.integers(0, 2 ** 32))))
def test_every_sample_completes_exactly_once_with_uninterrupted_tokens(reserved, schedule, adaptive,
                                                                       window_s, shape):
    initial, events = schedule
    policy = (AdaptiveWindow(AdaptiveWindowConfig(initial_window_s=window_s)) if adaptive
              else ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=window_s, floor_s=0.0)))
    groups_for, results = run_schedule(reserved, initial, events, policy, shape)
    for step, (batches, metrics) in enumerate(results):
        assert outputs(batches) == uninterrupted(groups_for[step], version=step)
        assert all(s.weight_version == step for mb in batches for g in mb.groups for s in g.samples)
        assert metrics.samples == sum(g.num_samples for g in groups_for[step])
        assert metrics.gaps == 0
        assert [mb.last for mb in batches].count(True) == 1
