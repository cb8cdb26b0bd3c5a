"""Offload policy: the adaptive window's closing rule and learning, and the reference rule."""

import pytest

from rlboost.controller.offload import (
    AdaptiveWindow,
    AdaptiveWindowConfig,
    ReferenceWindowConfig,
    ReferenceWindowRule,
    StepObservation,
    WindowContext,
    ideal_step_time,
    make_policy,
)


def ctx(elapsed=10.0, generated=0, remaining=1000.0, local=100.0, remote=50.0, n=2):
    return WindowContext(elapsed_s=elapsed, generated_tokens=generated, remaining_tokens=remaining,
                         local_tokens_per_s=local, remote_tokens_per_s=remote, num_preemptible=n)


def obs(trainer_idle=0.0, rollout_idle=0.0, n=2, tokens=1000, train=20.0, last_tokens=0, deliveries=()):
    return StepObservation(window_s=10.0, num_preemptible=n, total_tokens=tokens, step_time_s=30.0 + trainer_idle,
                           trainer_idle_s=trainer_idle, rollout_idle_s=rollout_idle, train_busy_s=train,
                           last_microbatch_tokens=last_tokens, deliveries=deliveries)


def test_adaptive_uses_the_initial_window_until_training_time_is_measured():
    p = AdaptiveWindow(AdaptiveWindowConfig(initial_window_s=7.0))
    assert not p.should_close(ctx(elapsed=6.9)) and p.should_close(ctx(elapsed=7.0))
    assert p.plan(ctx()) == 7.0


def test_adaptive_closes_when_remote_can_finish_the_rest_while_the_trainer_trains():
    p = AdaptiveWindow()
    p.observe(obs(tokens=1000, train=20.0))  # 0.02 s of training per token
    p.plan(ctx())
    # 1000 tokens -> 20 s of training; 50 tok/s of remote finish 1000 in 20 s: close
    assert p.should_close(ctx(remaining=1000.0, remote=50.0))
    p.plan(ctx())
    assert not p.should_close(ctx(remaining=1000.0, remote=40.0))
    # the plan solves for the window: (W - R_p * T) / (R_l + R_p)
    assert p.plan(ctx(remaining=2000.0, remote=50.0, local=150.0)) == pytest.approx((2000 - 50 * 40) / 200)
    assert p.plan(ctx(remaining=500.0)) == 0.0


def test_one_stalled_step_moves_the_training_estimate_a_little_a_lasting_change_fully():
    p = AdaptiveWindow(AdaptiveWindowConfig(train_ema=0.5, train_jump=2.0))
    p.observe(obs(tokens=1000, train=20.0))            # 0.02 s per token
    p.observe(obs(tokens=1000, train=1000.0))          # a 50x stall counts as 2x
    assert p.train_s_per_token == pytest.approx(0.03)  # 0.02 + 0.5 * (0.04 - 0.02)
    p.observe(obs(tokens=1000, train=20.0))
    assert p.train_s_per_token == pytest.approx(0.025)
    for _ in range(12):                                # training really got 10x slower
        p.observe(obs(tokens=1000, train=200.0))
    assert p.train_s_per_token == pytest.approx(0.2, rel=0.01)
    with pytest.raises(ValueError, match="train_jump"):
        AdaptiveWindowConfig(train_jump=0.5)


def test_adaptive_never_closes_without_a_preemptible_instance_and_respects_bounds():
    p = AdaptiveWindow(AdaptiveWindowConfig(min_window_s=3.0, max_window_s=60.0))
    p.observe(obs())
    assert not p.should_close(ctx(remote=0.0, remaining=1.0, n=0))
    assert not p.should_close(ctx(elapsed=2.0, remaining=1.0))
    assert p.should_close(ctx(elapsed=60.0, remaining=1e9))
    assert p.plan(ctx(remote=0.0, remaining=1000.0, local=100.0, n=0)) == 10.0


def test_a_starved_trainer_delays_the_close_and_slack_brings_it_forward():
    p = AdaptiveWindow(AdaptiveWindowConfig(up_gain=0.5, down_gain=0.5, idle_target_s=1.0))
    p.observe(obs())
    p.observe(obs(trainer_idle=21.0))  # starved 20 s beyond the target: close 10 s later
    assert p.delay(2) == pytest.approx(10.0)
    p.plan(ctx())
    assert not p.should_close(ctx(elapsed=1.0, remaining=100.0))  # the rates say close, the delay waits
    assert not p.should_close(ctx(elapsed=10.5, remaining=100.0))
    assert p.should_close(ctx(elapsed=11.0, remaining=100.0))
    # every group was ready some time before the trainer reached it: close half that earlier
    deliveries = ((30.0, ((20.0, 100), (25.0, 100))), (40.0, ((36.0, 50),)))
    assert p.slack(deliveries) == pytest.approx(min(30 - 20, 30 + 2 - 25, 40 - 36))
    p.observe(obs(deliveries=deliveries))
    assert p.delay(2) == pytest.approx(8.0)
    # an instance count never seen starts from the nearest learned one
    assert p.delay(5) == p.delay(2)


def test_a_short_step_aims_at_a_share_of_its_time_not_at_a_whole_second_of_idle():
    p = AdaptiveWindow(AdaptiveWindowConfig(up_gain=1.0, idle_target_s=1.0, idle_target_fraction=0.05))
    p.observe(obs())
    # a 2 s step whose trainer starved 0.8 s: under the 1 s target, but 0.7 s over 5% of 2 s
    p.observe(StepObservation(window_s=0.5, num_preemptible=2, total_tokens=1000, step_time_s=2.0,
                              trainer_idle_s=0.8, rollout_idle_s=0.0, train_busy_s=0.7, last_microbatch_tokens=0))
    assert p.delay(2) == pytest.approx(0.8 - 0.1)
    # a long step keeps the 1 s target
    p.observe(obs(trainer_idle=0.9))
    assert p.delay(2) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="idle_target_fraction"):
        AdaptiveWindowConfig(idle_target_fraction=0.0)


def test_a_negative_delay_closes_before_the_rates_say_so():
    p = AdaptiveWindow()
    p.observe(obs(tokens=1000, train=20.0))  # 0.02 s of training per token
    p.plan(ctx())
    assert not p.should_close(ctx(remaining=900.0, remote=20.0, local=100.0))  # 45 s remote > 18 s training
    p.delays[2] = -5.0
    # looking 5 s ahead, both sides remove 600 tokens: 300 / 20 = 15 s <= 18 s of training
    p.plan(ctx())
    assert p.should_close(ctx(remaining=900.0, remote=20.0, local=100.0))
    p.plan(ctx())
    assert not p.should_close(ctx(remaining=1100.0, remote=20.0, local=100.0))


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


@pytest.mark.parametrize("memory", [True, False])
def test_reference_rule_starts_a_remembered_count_from_its_optimum_unless_memory_is_off(memory):
    r = ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=100.0, seeded_optima=((4, 70.0),), memory=memory))
    r.observe(obs(trainer_idle=4.0, rollout_idle=1.0, n=2))  # count 2, not remembered: the gap rule, +1
    assert r.window == 101.0
    r.observe(obs(n=4))  # count 4: its seeded optimum, if the rule remembers
    assert r.window == (70.0 if memory else 101.0)
    assert bool(r.optima) == memory


def test_ideal_step_time_and_policy_factory():
    assert ideal_step_time(1000.0, 30.0, 100.0, 100.0) == 30.0  # remote alone covers it during training
    assert ideal_step_time(1000.0, 0.0, 100.0, 0.0) == 10.0
    assert isinstance(make_policy("reference"), ReferenceWindowRule)
    assert isinstance(make_policy("adaptive", AdaptiveWindowConfig()), AdaptiveWindow)
    with pytest.raises(ValueError, match="policy"):
        make_policy("fixed")
    with pytest.raises(ValueError, match="ReferenceWindowConfig"):
        make_policy("reference", AdaptiveWindowConfig())
    with pytest.raises(ValueError, match="up_gain"):
        AdaptiveWindowConfig(up_gain=0.0)
