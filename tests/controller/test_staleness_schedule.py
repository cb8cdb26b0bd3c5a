"""Bounded staleness in the controller: the next step starts ahead on preemptible instances
while the trainer trains, takes the new version when it is published, and under any schedule
of notices and deaths every sample completes exactly once with every token within the bound."""


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from staleness_harness import (
    RESERVED,
    SHAPE,
    check_steps,
    preemptions,
    run,
    run_under_preemptions,
    spot,
    train_in_flight,
)
from steps import take_step

from rlboost.errors import RolloutError
from rlboost.sim import make_groups


def test_the_next_step_runs_ahead_on_preemptible_instances_while_the_trainer_trains():
    async def body(svc, clock, fleet):
        fleet.spawn(RESERVED)
        for i in range(2):
            fleet.spawn(spot(f"spot-{i}"))
        await clock.asleep(1.0)
        return await train_in_flight(svc, clock, 3, 1, train_s=4.0, open_after_end=True)
    groups_for, results = run(body)
    check_steps(groups_for, results)
    later = [m for _, m in results[1:]]
    assert all(m.early_tokens > 0 and m.early_s > 0 for m in later)  # work done during training
    assert any(s.weight_version == step - 1 for step, (batches, _) in enumerate(results) if step
               for mb in batches for g in mb.groups for s in g.samples)
    assert all(m.tokens_per_instance for m in later)


def test_a_sample_that_moves_across_an_update_records_where_its_version_changed():
    async def body(svc, clock, fleet):
        fleet.spawn(RESERVED)
        for i in range(2):
            fleet.spawn(spot(f"spot-{i}", speed=8.0))
        await clock.asleep(1.0)
        return await train_in_flight(svc, clock, 3, 1, train_s=1.0, open_after_end=True,
                                     shape={**SHAPE, "max_new_tokens": 80, "num_groups": 6})
    groups_for, results = run(body)
    check_steps(groups_for, results)
    spans = [s.version_changes for _, (batches, _) in enumerate(results) for mb in batches
             for g in mb.groups for s in g.samples if s.version_changes]
    assert spans and all(len(c) == 2 and c[0][1] + 1 == c[1][1] for c in spans)


def test_ahead_needs_a_bound_and_the_reserved_instances_join_only_once_it_is_published():
    async def body(svc, clock, fleet):
        fleet.spawn(RESERVED)
        fleet.spawn(spot("spot-0"))
        await clock.asleep(1.0)
        svc.start_step(0, make_groups(0, **SHAPE), 0)
        with pytest.raises(RolloutError, match="end the running step"):
            svc.set_weight_version(1)  # past the running step's own version
        await take_step(svc)
        svc.start_step(1, make_groups(1, **SHAPE), 1, ahead=True)
        with pytest.raises(RolloutError, match="publish it"):
            svc.join_reserved()
        await svc.end_step()
    run(body)

    async def strict(svc, clock, fleet):
        fleet.spawn(RESERVED)
        with pytest.raises(RolloutError, match="max_staleness >= 1"):
            svc.start_step(1, make_groups(1, **SHAPE), 1, ahead=True)
    run(strict, max_staleness=0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=preemptions(), train_s=st.floats(0.5, 8.0))
def test_under_any_preemption_schedule_no_sample_is_lost_or_duplicated_and_every_token_is_within_the_bound(
        schedule, train_s):
    run_under_preemptions(schedule, train_s, bound=1, steps=3, open_after_end=True)
