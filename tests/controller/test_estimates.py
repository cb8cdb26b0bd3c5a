"""Rate and length estimates learn what instances and samples actually do."""

import pytest

from rlboost.controller.estimates import LengthModel, RateModel


def test_rate_model_learns_per_sample_and_aggregate_limits():
    m = RateModel(per_sample=10.0, aggregate=100.0, alpha=0.5, min_window_s=1.0)
    for _ in range(20):  # one sample alone decodes at 40 tok/s
        m.observe(tokens=40, seconds=1.0, running=1)
    assert m.per_sample == pytest.approx(40.0, rel=0.01)
    for _ in range(20):  # 16 samples together reach only 320 tok/s
        m.observe(tokens=320, seconds=1.0, running=16)
    assert m.aggregate == pytest.approx(320.0, rel=0.02)
    assert m.rate_at(16) == pytest.approx(20.0, rel=0.02) and m.rate_at(1) == pytest.approx(40.0, rel=0.01)
    assert m.full_rate(64) == pytest.approx(320.0, rel=0.02)


def test_rate_model_pools_short_observations():
    m = RateModel(per_sample=10.0, aggregate=100.0, min_window_s=1.0)
    m.observe(tokens=9, seconds=0.3, running=1)
    assert not m.observed and m.per_sample == 10.0
    m.observe(tokens=40, seconds=0.8, running=1)
    assert m.observed and m.per_sample > 10.0


def test_length_model_predicts_remaining_work_from_finished_lengths():
    m = LengthModel(min_count=3)
    assert m.expected_remaining(0, max_new=100) == pytest.approx(100.0)  # prior 256, capped
    for n in (10, 20, 30, 40, 50, 60):
        m.observe(n)
    assert m.expected_remaining(0, max_new=1000) == pytest.approx(35.0)
    assert m.expected_remaining(25, max_new=1000) == pytest.approx(20.0)  # mean of 30..60 minus 25
    assert m.expected_remaining(55, max_new=1000) == pytest.approx(35.0)  # past the data: a mean again
    assert m.expected_remaining(990, max_new=1000) == pytest.approx(10.0)  # never past max_new


def test_vectorized_total_matches_the_per_sample_estimate():
    m = LengthModel(min_count=3)
    progress, max_new = [0, 5, 25, 55, 990, 3], [1000, 1000, 1000, 1000, 1000, 2]
    prior = sum(m.expected_remaining(p, n) for p, n in zip(progress, max_new))
    assert m.expected_remaining_total(progress, max_new) == pytest.approx(prior)
    for n in (10, 20, 30, 40, 50, 60):
        m.observe(n)
    each = sum(m.expected_remaining(p, n) for p, n in zip(progress, max_new))
    assert m.expected_remaining_total(progress, max_new) == pytest.approx(each)
    assert m.expected_remaining_total([], []) == 0.0
