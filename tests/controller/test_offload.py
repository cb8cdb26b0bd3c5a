"""Offload policy: the adaptive window's closing rule and learning, and the reference rule."""

import pytest

from rlboost.controller.offload import (AdaptiveWindow, AdaptiveWindowConfig, ReferenceWindowConfig,
                                        ReferenceWindowRule, StepObservation, WindowContext,
                                        ideal_step_time, make_policy)


def ctx(elapsed=10.0, generated=0, remaining=1000.0, local=100.0, remote=50.0, n=2):
    return WindowContext(elapsed_s=elapsed, generated_tokens=generated, remaining_tokens=remaining,
                         local_tokens_per_s=local, remote_tokens_per_s=remote, num_preemptible=n)


def obs(trainer_idle=0.0, rollout_idle=0.0, n=2, tokens=1000, train=20.0, last_tokens=0):
    return StepObservation(window_s=10.0, num_preemptible=n, total_tokens=tokens, step_time_s=30.0 + trainer_idle,
                           trainer_idle_s=trainer_idle, rollout_idle_s=rollout_idle, train_busy_s=train,
                           last_microbatch_tokens=last_tokens)


def test_adaptive_uses_the_initial_window_until_training_time_is_measured():
    p = AdaptiveWindow(AdaptiveWindowConfig(initial_window_s=7.0))
    assert not p.should_close(ctx(elapsed=6.9)) and p.should_close(ctx(elapsed=7.0))
    assert p.plan(ctx()) == 7.0


def test_adaptive_closes_when_remote_can_finish_the_rest_while_the_trainer_trains():
    p = AdaptiveWindow()
    p.observe(obs(tokens=1000, train=20.0))  # 0.02 s of training per token
    # 1000 tokens -> 20 s of training; 50 tok/s of remote finish 1000 in 20 s: close
    assert p.should_close(ctx(remaining=1000.0, remote=50.0))
    assert not p.should_close(ctx(remaining=1000.0, remote=40.0))
    # the plan solves for the window: (W - R_p * T) / (R_l + R_p)
    assert p.plan(ctx(remaining=2000.0, remote=50.0, local=150.0)) == pytest.approx((2000 - 50 * 40) / 200)
    assert p.plan(ctx(remaining=500.0)) == 0.0


def test_adaptive_never_closes_without_a_preemptible_instance_and_respects_bounds():
    p = AdaptiveWindow(AdaptiveWindowConfig(min_window_s=3.0, max_window_s=60.0))
    p.observe(obs())
    assert not p.should_close(ctx(remote=0.0, remaining=1.0, n=0))
    assert not p.should_close(ctx(elapsed=2.0, remaining=1.0))
    assert p.should_close(ctx(elapsed=60.0, remaining=1e9))
    assert p.plan(ctx(remote=0.0, remaining=1000.0, local=100.0, n=0)) == 10.0


def test_correction_learns_the_straggler_tail_and_converges_within_a_few_steps():
    p = AdaptiveWindow(AdaptiveWindowConfig(gain=0.5))
    p.observe(obs())
    tail = 8.0  # remote actually needs 8 s more than rate arithmetic predicts
    for _ in range(6):
        c = p.correction(2)
        p.observe(obs(trainer_idle=max(0.0, tail - c), rollout_idle=max(0.0, c - tail)))
    assert p.correction(2) == pytest.approx(tail, abs=0.5)
    # a new instance count starts from the nearest learned one, and the rule uses today's rates
    assert p.correction(5) == p.correction(2)
    # rollout idle beyond the final micro-batch's training means the window was too long
    before = p.correction(2)
    p.observe(obs(rollout_idle=10.0, last_tokens=100))  # 100 tokens * 0.02 s = 2 s are due
    assert p.correction(2) == pytest.approx(before - 0.5 * 8.0)


def test_reference_rule_moves_by_a_third_of_the_gap_in_whole_seconds_with_a_floor():
    r = ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=150.0))
    assert r.plan(ctx()) == 150.0
    assert not r.should_close(ctx(elapsed=149.0)) and r.should_close(ctx(elapsed=150.0))
    assert not r.should_close(ctx(elapsed=500.0, remote=0.0))
    r.observe(obs(trainer_idle=10.9, rollout_idle=1.2))  # int: 10 - 1 = 9 -> +3
    assert r.window == 153.0
    r.observe(obs(trainer_idle=0.0, rollout_idle=1000.0))
    assert r.window == 5.0
    r.observe(obs(trainer_idle=0.0, rollout_idle=1000.0, n=0))  # no preemptible: nothing to balance
    assert r.window == 5.0


def test_ideal_step_time_and_policy_factory():
    assert ideal_step_time(1000.0, 30.0, 100.0, 100.0) == 30.0  # remote alone covers it during training
    assert ideal_step_time(1000.0, 0.0, 100.0, 0.0) == 10.0
    assert isinstance(make_policy("reference"), ReferenceWindowRule)
    assert isinstance(make_policy("adaptive", AdaptiveWindowConfig()), AdaptiveWindow)
    with pytest.raises(ValueError, match="policy"):
        make_policy("fixed")
    with pytest.raises(ValueError, match="ReferenceWindowConfig"):
        make_policy("reference", AdaptiveWindowConfig())
    with pytest.raises(ValueError, match="gain"):
        AdaptiveWindowConfig(gain=0.0)
