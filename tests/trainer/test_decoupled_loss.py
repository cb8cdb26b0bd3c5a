"""Bounded staleness in the trainer: per-token version checks and the decoupled objective."""

import pytest
import torch

from rlboost.errors import StaleSampleError
from rlboost.trainer.batch import ScoredSample, build_micro_batch
from rlboost.trainer.grpo import GRPOConfig, decoupled_loss, grpo_loss
from rlboost.trainer.split import split_for_ranks


def sample(sid, gid, version, reward, changes=(), n=3):
    return ScoredSample(sample_id=sid, group_id=gid, prompt_ids=(1, 2), output_ids=tuple(range(5, 5 + n)),
                        output_logprobs=tuple(-0.5 for _ in range(n)), reward=reward, weight_version=version,
                        version_changes=changes)


def test_strict_batches_still_refuse_any_other_version():
    with pytest.raises(StaleSampleError):
        build_micro_batch([sample(0, 0, 4, 1.0), sample(1, 0, 5, 0.0)], pad_id=0, weight_version=5)
    assert not build_micro_batch([sample(0, 0, 5, 1.0), sample(1, 0, 5, 0.0)], pad_id=0, weight_version=5).decoupled


def test_bounded_staleness_checks_every_token_of_a_sample_that_spans_an_update():
    spans = sample(1, 0, 4, 0.0, changes=((0, 4), (2, 5)))
    batch = build_micro_batch([sample(0, 0, 4, 1.0), spans], pad_id=0, weight_version=5, max_staleness=1)
    assert batch.decoupled and batch.weight_versions == (4, 4)
    too_old = sample(2, 1, 4, 0.0, changes=((0, 3), (1, 5)))
    with pytest.raises(StaleSampleError, match="sample 2 .*\\[3\\]"):
        build_micro_batch([too_old, sample(3, 1, 5, 1.0)], pad_id=0, weight_version=5, max_staleness=1)
    with pytest.raises(ValueError, match="change point"):
        sample(4, 1, 4, 0.0, changes=((0, 4), (3, 5)))  # past the sample's 3 tokens


def test_splitting_keeps_the_objective():
    batch = build_micro_batch([sample(0, 0, 4, 1.0), sample(1, 0, 5, 0.0)], pad_id=0, weight_version=5,
                              max_staleness=2)
    for packed in (False, True):
        assert all(f.decoupled for share in split_for_ranks(batch, 3, packed=packed) for f in share)


def grads(fn, logits, *args):
    x = logits.clone().requires_grad_(True)
    out = fn(torch.log_softmax(x, -1)[..., 0], *args)
    out.loss.backward()
    return out, x.grad


def test_decoupled_loss_on_policy_equals_the_clipped_loss():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6)
    mask = torch.tensor([[False, True, True, True], [False, True, True, False]])
    adv = torch.tensor([1.0, -0.5])
    behaviour = torch.where(mask, torch.log_softmax(logits, -1)[..., 0], torch.zeros(2, 4))
    cfg = GRPOConfig()
    plain, g_plain = grads(grpo_loss, logits, behaviour, adv, mask, cfg)
    dec, g_dec = grads(decoupled_loss, logits, behaviour, adv, mask, cfg)
    assert torch.allclose(g_plain, g_dec, atol=1e-6)
    assert dec.policy_loss == pytest.approx(plain.policy_loss, abs=1e-6)
    assert dec.is_weight_mean == pytest.approx(1.0, abs=1e-5) and dec.is_truncated_fraction == 0.0


def test_importance_weights_scale_the_gradient_and_are_truncated_at_the_cap():
    torch.manual_seed(1)
    logits = torch.randn(1, 4, 6)
    mask = torch.tensor([[False, True, True, True]])
    adv = torch.tensor([1.0])
    current = torch.where(mask, torch.log_softmax(logits, -1)[..., 0], torch.zeros(1, 4))
    # the behaviour policy gave the tokens less probability: weights 1.5 (kept) and 8 (truncated to 2)
    behaviour = current - torch.tensor([[0.0, 1.5, 8.0, 1.0]]).log() * mask
    cfg = GRPOConfig(is_weight_cap=2.0)
    _, g_on = grads(decoupled_loss, logits, current, adv, mask, cfg)
    out, g_off = grads(decoupled_loss, logits, behaviour, adv, mask, cfg)
    assert out.is_truncated_fraction == pytest.approx(1 / 3)
    assert out.is_weight_mean == pytest.approx((1.5 + 8.0 + 1.0) / 3, rel=1e-5)
    for t, w in ((1, 1.5), (2, 2.0), (3, 1.0)):
        assert torch.allclose(g_off[0, t], w * g_on[0, t], atol=1e-6)
    with pytest.raises(ValueError, match="is_weight_cap"):
        GRPOConfig(is_weight_cap=0.5)
