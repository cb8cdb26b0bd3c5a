"""Sampling draws depend only on (seed, sample id, token index) and follow the filtered
distribution they claim to."""

import math

import pytest
import torch

from rlboost.rollout.embedded.sampling import DrawSpec, draw_key, gumbel_noise, sample_tokens


def logits_rows(n, vocab=64, seed=0):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_a_rows_draw_does_not_depend_on_the_other_rows():
    logits = logits_rows(6)
    specs = [DrawSpec(temperature=0.7, top_k=0, top_p=1.0, key=draw_key(1, i, 5)) for i in range(6)]
    together, lp_together = sample_tokens(logits, specs)
    for i in range(6):
        alone, lp_alone = sample_tokens(logits[i:i + 1], specs[i:i + 1])
        assert alone == [together[i]] and lp_alone == [lp_together[i]]
    reversed_ids, _ = sample_tokens(logits.flip(0), specs[::-1])
    assert reversed_ids == together[::-1]


def test_noise_is_a_function_of_seed_sample_and_position():
    base = draw_key(7, 11, 3)
    assert draw_key(7, 11, 3) == base
    assert len({base, draw_key(8, 11, 3), draw_key(7, 12, 3), draw_key(7, 11, 4)}) == 4
    a = gumbel_noise([base, draw_key(7, 11, 4)], 1000, torch.device("cpu"))
    assert torch.equal(a[0], gumbel_noise([base], 1000, torch.device("cpu"))[0])
    assert not torch.equal(a[0], a[1]) and torch.isfinite(a).all()


def test_draws_follow_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(logits / 0.8, -1)[0]
    n = 4000
    counts = torch.zeros(4)
    for t in range(n):
        ids, _ = sample_tokens(logits, [DrawSpec(temperature=0.8, top_k=0, top_p=1.0, key=draw_key(0, 1, t))])
        counts[ids[0]] += 1
    # 5 standard deviations of a binomial count: fails only if the draw is biased
    assert ((counts - n * probs).abs() <= 5 * (n * probs * (1 - probs)).sqrt()).all()


def test_greedy_top_k_and_top_p_filters():
    logits = logits_rows(5, vocab=50, seed=3)
    best = logits.argmax(-1).tolist()
    greedy, lp = sample_tokens(logits, [DrawSpec(0.0, 0, 1.0, draw_key(0, i, 0)) for i in range(5)])
    assert greedy == best
    assert lp == pytest.approx(torch.log_softmax(logits, -1)[range(5), best].tolist(), abs=1e-6)
    top1, _ = sample_tokens(logits, [DrawSpec(1.5, 1, 1.0, draw_key(0, i, 0)) for i in range(5)])
    assert top1 == best
    tiny_p, _ = sample_tokens(logits, [DrawSpec(1.5, 0, 1e-6, draw_key(0, i, 0)) for i in range(5)])
    assert tiny_p == best
    top3 = set(logits[0].topk(3).indices.tolist())
    for t in range(200):
        ids, _ = sample_tokens(logits[:1], [DrawSpec(2.0, 3, 1.0, draw_key(0, 0, t))])
        assert ids[0] in top3


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    seen = set()
    for t in range(300):
        ids, lp = sample_tokens(logits, [DrawSpec(1.0, 0, 0.75, draw_key(2, 0, t))])
        seen.add(ids[0])
        assert math.isclose(lp[0], math.log([0.5, 0.3, 0.15, 0.05][ids[0]]), abs_tol=1e-6)
    assert seen == {0, 1}
