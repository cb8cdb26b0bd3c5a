"""What the bounded-staleness tests share: emulated spot and reserved instances, a controller on
virtual time with a fleet of them, waiting on a condition, and the check every step's samples
pass (each sample trained once, every token within the bound)."""

import asyncio

from controller_fakes import engine_config, outputs
from fleet_schedules import fleet_schedules
from hypothesis import strategies as st
from steps import take_step

from rlboost.controller.clock import run_virtual
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import ReferenceWindowConfig, ReferenceWindowRule
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import RouterConfig
from rlboost.controller.service import RolloutService
from rlboost.controller.staleness import accepted_versions, token_versions
from rlboost.sim import EmulatedFleet, SimInstance, make_groups

WATCHDOG_S = 5000.0  # virtual seconds; a schedule taking longer is a hang
SHAPE = dict(num_groups=4, group_size=2, prompt_len=3, max_new_tokens=30)
RESERVED = SimInstance(instance_id="reserved-0", kind="reserved", pull_s=0.0,
                       engine=engine_config(max_running=4, sample_tokens_per_s=40.0, decode_tokens_per_s=400.0))


def spot(name, speed=20.0, pull_s=0.5, capacity=4):
    return SimInstance(instance_id=name, pull_s=pull_s,
                       engine=engine_config(max_running=capacity, sample_tokens_per_s=speed,
                                            decode_tokens_per_s=10 * speed))


async def until(clock, cond, what, limit_s=600.0):
    deadline = clock.now() + limit_s
    while not cond():
        assert clock.now() < deadline, f"never happened: {what}"
        await clock.asleep(0.1)


async def train_in_flight(svc, clock, steps, n, train_s, shape=SHAPE, log=None, open_after_end=False):
    """The driver's loop with max_staleness n: at each step's start the next n steps are in
    flight (open_after_end: the next one only, started as soon as the running step's last
    micro-batch is taken, as the driver did before the free-slots schedule); the step ends as
    soon as its last micro-batch is taken (the next one runs on), the trainer trains for
    train_s, publishes, and the reserved instance joins the next step. Returns
    (groups by step, [(micro-batches, metrics)] per step)."""
    groups_for = {s: make_groups(s, **shape) for s in range(steps)}
    svc.start_step(0, groups_for[0], 0)
    started, results = {0}, []
    for step in range(steps):
        if step and n:
            await until(clock, lambda: svc.registry.get("reserved-0").weight_version == step, "reserved pulls")
            svc.join_reserved()
        elif step:  # strict on-policy: the step starts once its version is published
            svc.start_step(step, groups_for[step], step)
        for later in range(step + 1, min(step + n, steps - 1) + 1):
            if later not in started and not open_after_end:
                svc.start_step(later, groups_for[later], later, ahead=True)
                started.add(later)
        if log is not None:
            log.append((step, {lane.step: len(lane.router.queued) for lane in svc.steps.ahead}))
        results.append(await take_step(svc))
        if step + 1 < steps:
            if open_after_end and n:
                svc.start_step(step + 1, groups_for[step + 1], step + 1, ahead=True)
                started.add(step + 1)
            await clock.asleep(train_s)  # the trainer trains the step it just took, then publishes
            svc.set_weight_version(step + 1)
    return groups_for, results


def run(body, **cfg):
    """body(svc, clock, fleet) on virtual time, with max_staleness 1 unless cfg says otherwise."""
    async def main(clock):
        config = ControllerConfig(**{**dict(poll_interval_s=0.1, idle_timeout_s=60.0, call_timeout_s=2.0,
                                            max_staleness=1,
                                            registry=RegistryConfig(heartbeat_interval_s=0.5, drain_margin_s=1.0)),
                                     **cfg})
        svc = RolloutService(config, clock=clock,
                             window_policy=ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=1.0, floor_s=0)))
        await svc.start()
        fleet = EmulatedFleet(svc, clock)
        try:
            return await body(svc, clock, fleet)
        finally:
            await fleet.close()
            await svc.close()

    async def guarded(clock):
        return await asyncio.wait_for(main(clock), WATCHDOG_S)
    return run_virtual(guarded)


def check_steps(groups_for, results, bound=1):
    """Every step's samples trained once, no gap or duplicate, every token inside the step's
    window of versions; returns the trained tokens by lag (0..bound)."""
    lags = [0] * (bound + 1)
    for step, (batches, metrics) in enumerate(results):
        got = outputs(batches)  # asserts no sample is delivered twice
        assert got.keys() == {sid for g in groups_for[step] for sid in g.sample_ids}
        window = accepted_versions(step, bound)
        for mb in batches:
            for s in (s for g in mb.groups for s in g.samples):
                changes = s.version_changes or ((0, s.weight_version),)
                versions = token_versions(changes, len(s.output_ids))
                assert set(versions) <= set(window)
                for v in versions:
                    lags[step - v] += 1
        assert metrics.gaps == 0 and metrics.duplicates == 0 and [mb.last for mb in batches].count(True) == 1
    return lags


def preemptions():
    """Spot instances and a schedule of notices (with a grace period), sudden deaths and joins."""
    make = lambda name: st.builds(lambda speed, pull_s: spot(name, speed=speed, pull_s=pull_s),  # noqa: E731
                                  st.floats(5.0, 40.0), st.floats(0.0, 2.0))
    return fleet_schedules(make, initial=(1, 3), events=(1, 5), horizon_s=20.0, grace_s=8.0)


def run_under_preemptions(schedule, train_s, *, bound, steps, open_after_end=False):
    """A reserved instance and the schedule's spot instances, notices, deaths and joins, under
    the driver's loop with max_staleness bound; every step passes check_steps (returned: the
    trained tokens by lag)."""
    initial, events = schedule
    losses = len({e.instance_id for e in events if e.kind in ("death", "notice")})

    async def body(svc, clock, fleet):
        fleet.spawn(RESERVED)
        for spec in initial:
            fleet.spawn(spec)
        await clock.asleep(0.5)
        fleet.schedule(events)
        return await train_in_flight(svc, clock, steps, bound, train_s=train_s, open_after_end=open_after_end)
    groups_for, results = run(body, max_staleness=bound, router=RouterConfig(retry_budget=losses, min_steal_gain_s=0.5))
    return check_steps(groups_for, results, bound)
