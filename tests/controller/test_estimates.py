"""Rate and length estimates learn what instances and samples actually do."""

import pytest

from rlboost.controller.estimates import LengthModel, RateModel


def _engine(a: float, b: float, k: int) -> float:
    """Tokens/s an engine whose decode step takes a + b k seconds delivers with k samples."""
    return k / (a + b * k)


def test_rate_model_learns_a_step_time_that_grows_with_the_batch():
    m = RateModel(per_sample=10.0, aggregate=100.0, alpha=0.5, min_window_s=1.0)
    for i in range(200):  # the batch thins out and refills, as a step's tail and the next start do
        k = (1, 4, 16, 64, 200)[i % 5]
        m.observe(tokens=_engine(0.02, 0.002, k), seconds=1.0, running=k)
    assert m.rate_at(1) == pytest.approx(1 / 0.022, rel=0.01)  # a sample alone: 45 tok/s
    assert m.rate_at(16) == pytest.approx(1 / 0.052, rel=0.01)
    assert m.full_rate(200) == pytest.approx(_engine(0.02, 0.002, 200), rel=0.01)
    assert m.aggregate == pytest.approx(500.0, rel=0.01)


def test_rate_model_measured_only_when_crowded_still_expects_a_lone_sample_to_be_faster():
    m = RateModel(per_sample=30.0, aggregate=1000.0, min_window_s=1.0)
    for _ in range(50):  # only ever seen with 100 samples, each at 5 tok/s
        m.observe(tokens=500, seconds=1.0, running=100)
    assert m.rate_at(100) == pytest.approx(5.0, rel=0.01)
    assert m.rate_at(1) > 4 * m.rate_at(100)  # an emptied instance is worth moving samples to


def test_rate_model_pools_short_observations():
    m = RateModel(per_sample=10.0, aggregate=100.0, min_window_s=1.0)
    m.observe(tokens=9, seconds=0.3, running=1)
    assert not m.observed and m.per_sample == pytest.approx(10.0)
    m.observe(tokens=40, seconds=0.8, running=1)
    assert m.observed and m.per_sample > 10.0


def test_rate_model_rejects_non_positive_rates():
    with pytest.raises(ValueError, match="rates must be > 0"):
        RateModel(per_sample=0.0, aggregate=100.0)
    with pytest.raises(ValueError, match="aggregate must be > 0"):
        RateModel(per_sample=10.0, aggregate=100.0).aggregate = -1.0


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
