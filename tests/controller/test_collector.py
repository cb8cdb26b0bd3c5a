"""Collector: exactly-once tokens, gaps, divergence, staleness, whole groups in micro-batches."""

import pytest

from rlboost.controller.collector import APPLIED, DUPLICATE, FOREIGN, GAP, Collector
from rlboost.errors import ProtocolError, StaleSampleError
from rlboost.rollout.engine import TokenDelta
from rlboost.sim import make_groups

GROUPS = make_groups(0, num_groups=3, group_size=2, prompt_len=2, max_new_tokens=8)


def delta(sid, start, ids, finish=None, version=0):
    return TokenDelta(sample_id=sid, start=start, ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids),
                      finish_reason=finish, weight_version=version)


def finish_group(col, g, tokens=(5, 2)):
    for sid in g.sample_ids:
        col.apply(delta(sid, 0, tokens, "stop"))


def test_deltas_are_deduplicated_by_start_and_gaps_are_detected():
    col = Collector(0, GROUPS, 0, microbatch_min_samples=2)
    sid = GROUPS[0].sample_ids[0]
    assert col.apply(delta(sid, 0, [7, 8])) == APPLIED
    assert col.apply(delta(sid, 0, [7, 8])) == DUPLICATE
    assert col.apply(delta(sid, 1, [8, 9])) == APPLIED  # overlapping resend adds only the new token
    assert col.apply(delta(sid, 5, [1])) == GAP
    assert col.progress(sid) == 3 and col.tokens == 3 and col.gaps == 1 and col.duplicates == 1
    assert col.apply(delta(999, 0, [1])) == FOREIGN
    with pytest.raises(ProtocolError, match="diverged"):
        col.apply(delta(sid, 2, [4]))
    col.apply(delta(sid, 3, [], "stop"))
    with pytest.raises(ProtocolError, match="after it finished"):
        col.apply(delta(sid, 3, [4]))


def test_tokens_from_the_wrong_weight_version_fail_loudly():
    col = Collector(0, GROUPS, 5, microbatch_min_samples=2)
    with pytest.raises(StaleSampleError, match="version 4"):
        col.apply(delta(GROUPS[0].sample_ids[0], 0, [1], version=4))
    relaxed = Collector(0, GROUPS, 5, microbatch_min_samples=2, max_staleness=1)
    assert relaxed.apply(delta(GROUPS[0].sample_ids[0], 0, [1], version=4)) == APPLIED


def test_groups_are_released_whole_in_micro_batches_of_the_minimum_size():
    col = Collector(0, GROUPS, 0, microbatch_min_samples=4)
    g0, g1, g2 = GROUPS
    col.apply(delta(g0.sample_ids[0], 0, [3, 2], "stop"))
    finish_group(col, g1)
    assert col.take() is None  # g1 is complete but only 2 samples are ready, g0 is half done
    col.apply(delta(g0.sample_ids[1], 0, [2], "stop"))
    mb = col.take()
    assert [g.group_id for g in mb.groups] == [g1.group_id, g0.group_id] and not mb.last
    assert mb.num_samples == 4 and mb.num_tokens == 2 + 2 + 2 + 1
    finish_group(col, g2)
    last = col.take()  # the rest of the step goes out even though it is below the minimum
    assert [g.group_id for g in last.groups] == [g2.group_id] and last.last
    assert col.take() is None and col.all_done


def test_absorbing_an_exported_state_takes_unpolled_tokens():
    col = Collector(0, GROUPS, 0, microbatch_min_samples=2)
    sid = GROUPS[0].sample_ids[0]
    col.apply(delta(sid, 0, [7]))
    exported = col.state_of(sid, 0).extended((8, 9), (-0.1, -0.2))
    assert col.absorb(exported, 0) == APPLIED and col.progress(sid) == 3
    assert col.state_of(sid, 0).output_ids == (7, 8, 9)


def test_microbatch_size_must_be_a_multiple_of_the_group_size():
    with pytest.raises(ValueError, match="multiple"):
        Collector(0, GROUPS, 0, microbatch_min_samples=3)
    with pytest.raises(ValueError, match="at least one"):
        Collector(0, [], 0, microbatch_min_samples=2)
    with pytest.raises(ValueError, match="unique"):
        Collector(0, [GROUPS[0], GROUPS[0]], 0, microbatch_min_samples=2)


def test_a_delta_with_a_logprob_per_token_missing_is_refused_on_arrival():
    import pickle

    col = Collector(0, GROUPS, 0, microbatch_min_samples=2)
    sid = GROUPS[0].sample_ids[0]
    good = delta(sid, 0, [7, 8])
    # as it would arrive from another process: unpickling runs no __post_init__ checks
    bad = pickle.loads(pickle.dumps(good))
    object.__setattr__(bad, "logprobs", (-0.5,))
    with pytest.raises(ProtocolError, match="logprobs"):
        col.apply(bad)
    assert col.progress(sid) == 0 and col.tokens == 0
    assert col.apply(good) == APPLIED
