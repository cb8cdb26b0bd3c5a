"""The published mechanisms, selectable: the 1/3 window rule with its per-instance-count
memory, in the run's time unit, and a moved group trimmed to its shortest member."""

from __future__ import annotations

import pytest

from rlboost.controller.config import ControllerConfig
from rlboost.controller.continuation import resume_points
from rlboost.controller.offload import ReferenceWindowConfig, ReferenceWindowRule, StepObservation


def _obs(n: int, tokens: int, step_s: float, trainer_idle: float, rollout_idle: float) -> StepObservation:
    return StepObservation(window_s=10, num_preemptible=n, total_tokens=tokens, step_time_s=step_s,
                           trainer_idle_s=trainer_idle, rollout_idle_s=rollout_idle, train_busy_s=1.0,
                           last_microbatch_tokens=0)


def test_a_count_with_a_seeded_optimum_starts_from_it():
    rule = ReferenceWindowRule(ReferenceWindowConfig(seeded_optima=((4, 70.0), (2, 160.0))))
    rule.observe(_obs(4, 1000, 100, 0, 0))
    assert rule.window == 70.0
    rule.observe(_obs(2, 1000, 100, 0, 0))
    assert rule.window == 160.0


def test_the_rule_counts_in_the_runs_time_unit():
    # one rule-second is 1/25 s of the run: idle gaps of 30 and 0 rule-seconds move it by 10
    rule = ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=6.0, floor_s=0.2, unit_s=0.04))
    rule.observe(_obs(1, 1000, 100, trainer_idle=30 * 0.04, rollout_idle=0.0))
    assert rule.window == pytest.approx(6.0 + 10 * 0.04)


def test_trimmed_groups_resume_from_their_shortest_member():
    moved = {100: 40, 101: 55, 200: 7}
    assert resume_points(moved, lambda s: s // 100, "trim_group") == {100: 40, 101: 40, 200: 7}
    assert resume_points(moved, lambda s: s // 100, "token") == moved
    # a finished member shorter than every moved one sets its group's point (the whole group is one request)
    assert resume_points(moved, lambda s: s // 100, "trim_group", finished={1: 12}) == {100: 12, 101: 12, 200: 7}
    assert resume_points(moved, lambda s: s // 100, "token", finished={1: 12}) == moved
    with pytest.raises(ValueError, match="continuation"):
        ControllerConfig(continuation="restart")
    with pytest.raises(ValueError, match="migration"):
        ControllerConfig(migration="restart")
