"""GRPO loss, advantages and token log-probs against values worked out by hand."""

import math

import pytest
import torch

from rlboost.trainer.grpo import GRPOConfig, aggregate, group_advantages, grpo_loss, kl_k3, token_logprobs

LN = math.log


def test_group_advantages_normalise_by_unbiased_group_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv = group_advantages(rewards, groups, eps=1e-12)
    # group 0: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3 -> +-0.5 / sqrt(1/3) = +-sqrt(3)/2
    h = math.sqrt(3) / 2
    # group 1: equal rewards -> 0; group 2: a single sample -> 0
    torch.testing.assert_close(adv, torch.tensor([h, -h, -h, h, 0.0, 0.0, 0.0]))


def test_group_advantages_interleaved_groups_and_centring_only():
    rewards = torch.tensor([1.0, 4.0, 3.0, 0.0])
    groups = torch.tensor([3, 1, 3, 1])
    r = 1 / math.sqrt(2)  # group 3: [-1, 1] / sqrt(2); group 1: [2, -2] / sqrt(8)
    torch.testing.assert_close(group_advantages(rewards, groups, eps=1e-12),
                               torch.tensor([-r, r, r, -r]))
    torch.testing.assert_close(group_advantages(rewards, groups, normalize_std=False),
                               torch.tensor([-1.0, 2.0, 1.0, -2.0]))


def test_group_advantages_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


def _two_token_case(advantage):
    # One sequence of 4 positions: prompt token, two response tokens, one padding token
    # whose log-prob is garbage and must not matter.
    logprobs = torch.tensor([[0.0, LN(1.5), LN(0.5), 7.0]], requires_grad=True)
    old = torch.zeros(1, 4)
    mask = torch.tensor([[False, True, True, False]])
    return logprobs, old, torch.tensor([advantage]), mask


def test_positive_advantage_clips_the_high_ratio_only():
    logprobs, old, adv, mask = _two_token_case(1.0)
    out = grpo_loss(logprobs, old, adv, mask, GRPOConfig())
    # ratios 1.5 and 0.5; A=+1: min(1.5, 1.2) = 1.2 and min(0.5, 0.8) = 0.5 -> -(1.2 + 0.5) / 2
    assert out.loss.item() == pytest.approx(-0.85)
    assert out.clip_fraction == pytest.approx(0.5)
    assert out.mean_ratio == pytest.approx(1.0)
    assert out.num_tokens == 2
    out.loss.backward()
    # the clipped token has no gradient; d(-r/2)/dlogp = -r/2 = -0.25 for the other
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, -0.25, 0.0]]))


def test_negative_advantage_clips_the_low_ratio_only():
    logprobs, old, adv, mask = _two_token_case(-1.0)
    out = grpo_loss(logprobs, old, adv, mask, GRPOConfig())
    # A=-1: -min(-1.5, -1.2) = 1.5 and -min(-0.5, -0.8) = 0.8 -> (1.5 + 0.8) / 2
    assert out.loss.item() == pytest.approx(1.15)
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.75, 0.0, 0.0]]))


def test_clip_higher_uses_the_upper_epsilon():
    logprobs, old, adv, mask = _two_token_case(1.0)
    out = grpo_loss(logprobs, old, adv, mask, GRPOConfig(clip_eps_low=0.2, clip_eps_high=0.28))
    assert out.loss.item() == pytest.approx(-(1.28 + 0.5) / 2)


def _two_sequence_case():
    logprobs = torch.tensor([[0.0, LN(1.5), LN(0.5)], [0.0, 0.0, 0.0]])
    old = torch.zeros(2, 3)
    mask = torch.tensor([[False, True, True], [False, False, True]])
    adv = torch.tensor([1.0, 0.5])
    return logprobs, old, adv, mask  # per-token losses: [-1.2, -0.5] and [-0.5]


def test_token_mean_and_seq_mean_aggregation():
    lp, old, adv, mask = _two_sequence_case()
    token = grpo_loss(lp, old, adv, mask, GRPOConfig(aggregation="token_mean"))
    seq = grpo_loss(lp, old, adv, mask, GRPOConfig(aggregation="seq_mean"))
    assert token.loss.item() == pytest.approx((-1.2 - 0.5 - 0.5) / 3)
    assert seq.loss.item() == pytest.approx((-0.85 + -0.5) / 2)


def test_step_denominator_replaces_the_local_count():
    lp, old, adv, mask = _two_sequence_case()
    out = grpo_loss(lp, old, adv, mask, GRPOConfig(), denominator=4)
    assert out.loss.item() == pytest.approx(-2.2 / 4)
    seq = grpo_loss(lp, old, adv, mask, GRPOConfig(aggregation="seq_mean"), denominator=5)
    assert seq.loss.item() == pytest.approx((-0.85 - 0.5) / 5)
    with pytest.raises(ValueError, match="denominator"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), "token_mean", 0)


def test_seq_mean_ignores_sequences_without_response_tokens():
    values = torch.tensor([[2.0, 4.0], [9.0, 9.0]])
    mask = torch.tensor([[True, True], [False, False]])
    assert aggregate(values, mask, "seq_mean").item() == pytest.approx(3.0)


def test_per_token_advantages_are_accepted():
    lp, old, _, mask = _two_sequence_case()
    adv = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.5]])
    out = grpo_loss(lp, old, adv, mask, GRPOConfig())
    assert out.loss.item() == pytest.approx((-1.2 - 0.5 - 0.5) / 3)


def test_k3_kl_value_and_gradient():
    logp = torch.tensor([LN(0.5), LN(0.3)], requires_grad=True)
    ref = torch.tensor([LN(0.25), LN(0.3)])
    kl = kl_k3(logp, ref)
    # token 0: r = 0.5, k3 = 0.5 - ln 0.5 - 1; token 1 matches the reference: 0
    torch.testing.assert_close(kl.detach(), torch.tensor([0.5 - LN(0.5) - 1.0, 0.0]))
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([1.0 - 0.5, 0.0]))  # d/dlogp = 1 - r


def test_kl_term_is_added_with_its_coefficient():
    lp = torch.tensor([[0.0, LN(0.5), LN(0.3)]])
    old = lp.clone()  # ratio 1 everywhere
    ref = torch.tensor([[5.0, LN(0.25), LN(0.3)]])
    mask = torch.tensor([[False, True, True]])
    out = grpo_loss(lp, old, torch.tensor([0.0]), mask, GRPOConfig(kl_coef=0.1), ref_logprobs=ref)
    expected_kl = (0.5 - LN(0.5) - 1.0) / 2
    assert out.kl == pytest.approx(expected_kl)
    assert out.loss.item() == pytest.approx(0.1 * expected_kl)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(lp, old, torch.tensor([0.0]), mask, GRPOConfig(kl_coef=0.1))


def test_token_logprobs_are_shifted_and_masked():
    logits = torch.tensor([[[0.0, LN(2.0), 0.0],    # predicts position 1: p = [.25, .5, .25]
                            [0.0, 0.0, 0.0],        # predicts position 2: uniform
                            [9.0, 9.0, 9.0]]])      # predicts nothing
    ids = torch.tensor([[0, 1, 2]])
    torch.testing.assert_close(token_logprobs(logits, ids),
                               torch.tensor([[0.0, LN(0.5), -LN(3.0)]]))
    mask = torch.tensor([[False, False, True]])
    torch.testing.assert_close(token_logprobs(logits, ids, mask), torch.tensor([[0.0, 0.0, -LN(3.0)]]))
    with pytest.raises(ValueError, match="position 0"):
        token_logprobs(logits, ids, torch.tensor([[True, False, False]]))
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs(logits, ids[:, :2])


def test_token_logprobs_match_log_softmax_on_random_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g) * 4
    ids = torch.randint(0, 11, (2, 5), generator=g)
    expected = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, ids)[:, 1:], expected)


@pytest.mark.parametrize("field,value", [
    ("clip_eps_low", 0.0), ("clip_eps_low", 1.0), ("clip_eps_high", 0.0),
    ("kl_coef", -0.1), ("std_eps", 0.0), ("aggregation", "sum")])
def test_config_rejects_out_of_range_values(field, value):
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**{field: value})
