"""The bounded-staleness rules: version windows, who may start the next step, per-token versions."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost.controller.staleness import (
    accepted_versions,
    check_changes,
    check_within,
    extend_changes,
    may_start,
    open_steps,
    staleness_histogram,
    token_versions,
)
from rlboost.errors import StaleSampleError


def test_strict_on_policy_accepts_only_the_steps_own_version():
    assert list(accepted_versions(5, 0)) == [5]
    assert may_start(5, 5, 0) and not may_start(4, 5, 0)
    assert list(open_steps(5, 0)) == [5]


def test_window_reaches_back_n_versions_and_never_below_zero():
    assert list(accepted_versions(5, 2)) == [3, 4, 5]
    assert list(accepted_versions(1, 2)) == [0, 1]
    assert list(open_steps(3, 2)) == [3, 4, 5]


def test_an_instance_may_start_the_next_steps_prompts_on_the_version_it_holds():
    # trainer trains step 3 (publishes 4 later); an instance still on 3 may start step 4
    assert may_start(3, 4, 1)
    assert not may_start(2, 4, 1)      # two behind with a bound of 1
    assert may_start(2, 4, 2)
    assert not may_start(5, 4, 2)      # a version newer than the step's cannot exist for it


@pytest.mark.parametrize("bad", [-1, 9, 1.0, True])
def test_bound_outside_0_to_8_is_refused(bad):
    with pytest.raises(ValueError, match="max_staleness"):
        accepted_versions(3, bad)


def test_a_sample_spanning_an_update_records_where_its_version_changed():
    ch = extend_changes((), 0, 3, 4)
    ch = extend_changes(ch, 3, 2, 4)        # same version: no new change point
    ch = extend_changes(ch, 5, 0, 5)        # no tokens: nothing recorded
    ch = extend_changes(ch, 5, 2, 5)
    assert ch == ((0, 4), (5, 5))
    assert token_versions(ch, 7) == (4, 4, 4, 4, 4, 5, 5)


@pytest.mark.parametrize("changes,length", [
    ((), 3), (((1, 0),), 3), (((0, 1), (0, 2)), 3), (((0, 1), (2, 1)), 3), (((0, 1), (3, 2)), 3),
    (((0, 0),), 0), (((0, -1),), 2)])
def test_malformed_change_points_are_refused(changes, length):
    with pytest.raises(ValueError):
        check_changes(changes, length)


def test_any_token_staler_than_the_bound_is_refused():
    check_within(((0, 4), (3, 5)), 6, 5, 1, sample_id=7)
    with pytest.raises(StaleSampleError, match="sample 7 .*version\\(s\\) \\[3\\] .*accepts 4..5"):
        check_within(((0, 3), (3, 5)), 6, 5, 1, sample_id=7)
    with pytest.raises(StaleSampleError):
        check_within(((0, 5),), 2, 5, 0, sample_id=1) or check_within(((0, 4),), 2, 5, 0, sample_id=1)


def test_histogram_counts_tokens_by_lag():
    samples = [(((0, 5),), 4), (((0, 4), (2, 5)), 6), (((0, 3),), 1)]
    assert staleness_histogram(5, 2, samples) == (8, 2, 1)
    with pytest.raises(StaleSampleError, match="sample 2"):
        staleness_histogram(5, 1, samples)


@given(runs=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), max_size=12), step=st.integers(0, 6),
       n=st.integers(0, 3))
def test_changes_expand_to_the_versions_of_every_run(runs, step, n):
    changes, length, expect = (), 0, []
    for tokens, version in runs:
        changes = extend_changes(changes, length, tokens, version)
        length += tokens
        expect += [version] * tokens
    assert token_versions(changes, length) == tuple(expect)
    inside = all(v in accepted_versions(step, n) for v in expect)
    if inside:
        hist = staleness_histogram(step, n, [(changes, length)])
        assert sum(hist) == length
        assert all(hist[step - v] >= 1 for v in expect)
    else:
        with pytest.raises(StaleSampleError):
            check_within(changes, length, step, n, sample_id=0)
