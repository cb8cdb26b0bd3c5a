"""The free-slots schedule of bounded staleness in the controller (controller.ahead): with
max_staleness N the driver keeps up to N later steps in flight; their prompts take free slots
once every earlier step's are placed, on the version each engine holds; the next step becomes
the running one as soon as the trainer takes the last micro-batch of the one before; under any
schedule of notices, deaths and joins every sample completes exactly once with every token
within the bound."""

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from staleness_harness import (
    RESERVED,
    check_steps,
    preemptions,
    run,
    run_under_preemptions,
    spot,
    train_in_flight,
    until,
)

from rlboost.controller.ahead import AFTER_ROLLOUT, FREE_SLOTS, StepsAhead
from rlboost.controller.clock import ManualClock
from rlboost.controller.estimates import LengthModel, RateModel
from rlboost.controller.records import InstanceInfo
from rlboost.controller.registry import Registry, RegistryConfig
from rlboost.controller.round import StepRound, run_now
from rlboost.controller.router import Router, RouterConfig
from rlboost.controller.step import Outcome
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.sim.collector import SimCollector
from rlboost.sim.workload import sim_groups

# -- the rules, on a registry of its own ------------------------------------------------------------

class RatesForTests:
    """The engine table's two answers the schedule needs: membership and measured rates."""

    def __init__(self, ids):
        self.ids = set(ids)

    def __contains__(self, iid):
        return iid in self.ids

    def rates(self, iid):
        return RateModel(per_sample=50.0, aggregate=100.0)


def _lanes(n, schedule=FREE_SLOTS, versions=None):
    clock = ManualClock()
    reg = Registry(RegistryConfig(), clock, max_staleness=n)
    versions = versions or {"reserved-0": 0, "spot-0": 0, "spot-1": 0}
    for iid, version in versions.items():
        reg.register(InstanceInfo(instance_id=iid, kind="reserved" if iid.startswith("reserved") else "preemptible",
                                  capacity=4))
        reg.heartbeat(iid, version)
    ahead = StepsAhead(n, registry=reg, table=RatesForTests(versions), router=RouterConfig(), lengths=LengthModel(),
                       poll_interval_s=0.1, schedule=schedule)
    return clock, reg, ahead


def _collector(step):
    groups = sim_groups(step, num_groups=2, group_size=2, prompt_len=4, max_new_tokens=8,
                        engine=EmulatedEngineConfig(), seed=0)
    return SimCollector(groups, min_samples=2)


def test_lanes_open_up_to_the_bound_past_the_published_version():
    _, reg, ahead = _lanes(2)
    for step in (1, 2):
        assert ahead.may_open(0, reserved=False, running_taken=False)
        ahead.open(ahead.next_step(0), _collector(step), 0.0)
    assert [lane.step for lane in ahead] == [1, 2]
    assert not ahead.may_open(0, reserved=True, running_taken=True)  # step 3 is past version 0 + 2
    reg.set_weight_version(1)
    assert not ahead.may_open(0, reserved=False, running_taken=False)  # none holds a version step 3 accepts
    reg.heartbeat("spot-0", 1)
    assert ahead.may_open(0, reserved=False, running_taken=False)


def test_the_after_rollout_schedule_opens_one_lane_once_the_running_step_is_taken():
    _, _, ahead = _lanes(2, schedule=AFTER_ROLLOUT)
    assert not ahead.may_open(0, reserved=False, running_taken=False)
    assert ahead.may_open(0, reserved=False, running_taken=True)
    ahead.open(1, _collector(1), 0.0)
    assert not ahead.may_open(0, reserved=False, running_taken=True)


def test_only_engines_that_may_start_the_step_take_its_prompts_and_reserved_ones_only_in_the_window():
    _, reg, ahead = _lanes(1)
    lane = ahead.open(1, _collector(1), 0.0)
    held = ahead.held([])
    assert {v.instance_id for v in ahead.views(lane, held, reserved=True)} == {"reserved-0", "spot-0", "spot-1"}
    assert {v.instance_id for v in ahead.views(lane, held, reserved=False)} == {"spot-0", "spot-1"}
    held["spot-0"] = 4  # full with earlier steps' samples
    assert {v.instance_id for v in ahead.views(lane, held, reserved=False)} == {"spot-1"}
    # an engine whose version is outside step 2's window with N = 1 never starts it
    _, reg, ahead = _lanes(1, versions={"spot-0": 0})
    ahead.open(1, _collector(1), 0.0)
    assert not ahead.may_open(1, reserved=False, running_taken=False)


# -- the schedule in the controller, over emulated engines on virtual time ----------------------------

def test_with_staleness_2_two_later_steps_take_free_slots_and_tokens_two_versions_old_are_trained():
    log = []

    async def body(svc, clock, fleet):
        fleet.spawn(RESERVED)
        for i in range(3):
            fleet.spawn(spot(f"spot-{i}"))
        await clock.asleep(1.0)
        return await train_in_flight(svc, clock, 5, 2, train_s=6.0, log=log)
    groups_for, results = run(body, max_staleness=2)
    lags = check_steps(groups_for, results, 2)
    assert lags[1] > 0 and lags[2] > 0  # the free slots ran two steps ahead
    assert all(len(ahead) == 2 for step, ahead in log[:3])  # two steps in flight beside the running one
    later = [m for _, m in results[1:]]
    assert all(m.early_tokens > 0 for m in later)  # their rollout began before they became the running step


def test_staleness_0_keeps_no_steps_ahead():
    async def body(svc, clock, fleet):
        fleet.spawn(RESERVED)
        fleet.spawn(spot("spot-0"))
        await clock.asleep(1.0)
        assert svc.steps.ahead is None and svc.table.ahead is None
        return await train_in_flight(svc, clock, 2, 0, train_s=1.0)
    groups_for, results = run(body, max_staleness=0)
    assert check_steps(groups_for, results, 0)[0] == sum(m.total_tokens for _, m in results)


def _ahead_tokens_on(svc, iid):
    """Tokens the steps ahead's unfinished samples on the instance have collected."""
    return sum(lane.st.collector.progress(sid) for lane in svc.steps.ahead or ()
               for sid in lane.router.samples_on(iid) if not lane.st.collector.finished(sid))


def _death_with_a_step_ahead_on_it(migration):
    """spot-0 dies while it decodes step 1's samples (the step ahead); the step's metrics."""
    async def body(svc, clock, fleet):
        fleet.spawn(RESERVED)
        fleet.spawn(spot("spot-0"))
        fleet.spawn(spot("spot-1"))
        await clock.asleep(1.0)

        async def kill_when_it_holds_step_ahead_tokens():
            await until(clock, lambda: _ahead_tokens_on(svc, "spot-0") > 0, "step 1's tokens on spot-0")
            fleet.kill("spot-0")
        killer = asyncio.ensure_future(kill_when_it_holds_step_ahead_tokens())
        out = await train_in_flight(svc, clock, 3, 1, train_s=4.0)
        await killer
        return out
    groups_for, results = run(body, migration=migration)
    check_steps(groups_for, results, 1)
    return results[1][1]


def test_a_death_restarts_the_steps_ahead_samples_from_their_prompt_under_recompute():
    """migration="recompute" (the paper's baseline): the dead instance's samples of a step
    ahead start again from their prompt, as the running step's do, and their discarded tokens
    are the preemption's; with "continue" they resume from their last token, nothing discarded."""
    recompute, resume = _death_with_a_step_ahead_on_it("recompute"), _death_with_a_step_ahead_on_it("continue")
    assert recompute.preempted_samples > 0 and resume.preempted_samples > 0
    assert recompute.preempted_regenerated_tokens > 0
    assert resume.preempted_regenerated_tokens == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=preemptions(), train_s=st.floats(0.5, 8.0), bound=st.integers(1, 2))
def test_under_any_preemption_schedule_nothing_is_lost_or_duplicated_and_every_token_is_within_the_bound(
        schedule, train_s, bound):
    run_under_preemptions(schedule, train_s, bound=bound, steps=4)


class RecordingMoverForTests:
    """A Mover that starts whatever it is sent (in the lane's router) and records the order."""

    def __init__(self, ahead):
        self.ahead, self.sent = ahead, []

    async def send(self, st, iid, sids):
        lane = self.ahead.holding(st)
        for sid in sids:
            lane.router.assign(sid, iid)
        self.sent.append((lane.step, iid, tuple(sids)))
        return Outcome()


def test_a_later_step_takes_no_slot_while_an_earlier_one_has_prompts_waiting():
    clock, reg, ahead = _lanes(2, versions={"spot-0": 0})  # one engine of 4 slots
    mover = RecordingMoverForTests(ahead)
    rnd = StepRound(clock, decisions=None, registry=reg, router=Router(RouterConfig()), table=ahead.table,
                    mover=mover, note=lambda out: out, fail=lambda exc: None, wake=lambda: None)
    big = SimCollector(sim_groups(1, num_groups=3, group_size=2, prompt_len=4, max_new_tokens=8,
                                  engine=EmulatedEngineConfig(), seed=0), min_samples=2)
    ahead.open(1, big, 0.0)
    ahead.open(2, _collector(2), 0.0)
    run_now(rnd.place_ahead(None, ahead))
    assert {step for step, _, _ in mover.sent} == {1} and sum(len(s) for _, _, s in mover.sent) == 4
    assert len(ahead[0].router.queued) == 2 and len(ahead[1].router.queued) == 4  # step 2 waits
    for sid in ahead[0].router.samples_on("spot-0")[:3]:  # three of step 1's finish: step 1's two go first
        ahead[0].router.finish(sid)
    run_now(rnd.place_ahead(None, ahead))
    assert [step for step, _, _ in mover.sent[1:]] == [1, 2]
    assert not ahead[0].router.queued and len(ahead[1].router.queued) == 3
