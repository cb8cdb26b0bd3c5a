"""An episode in the collector: a turn that stops waits for its environment, the observation
joins its output masked as not the model's, it runs on from its last token, and only the
end of the episode completes it (and its group)."""

import pytest

from rlboost.controller.collector import APPLIED, DUPLICATE, Collector
from rlboost.controller.records import PromptGroup
from rlboost.errors import ProtocolError
from rlboost.migration.state import SamplingParams
from rlboost.rollout.engine import TokenDelta


def collector(episodes=True, num_samples=1):
    group = PromptGroup(group_id=0, prompt_ids=(1, 2), params=SamplingParams(max_new_tokens=32, stop_token_ids=(9,)),
                        num_samples=num_samples, seed=5)
    return Collector(0, [group], 0, microbatch_min_samples=num_samples, episodes=episodes)


def delta(start, ids, finish=None, sid=0):
    return TokenDelta(sample_id=sid, start=start, ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids),
                      finish_reason=finish, weight_version=0)


def test_a_turn_ends_the_turn_and_the_episode_ends_the_sample():
    col = collector()
    assert col.apply(delta(0, [3, 4, 9], "stop")) == APPLIED
    assert col.awaiting(0) and not col.finished(0) and col.take_turn_ends() == [0]
    assert col.take_turn_ends() == []  # each turn once
    assert col.turn(0) == (0, (3, 4, 9), "stop")
    col.observe(0, (7, 7), done=False)
    assert not col.awaiting(0) and col.state_of(0, 0).output_ids == (3, 4, 9, 7, 7)  # resumes after the observation
    assert col.apply(delta(5, [5, 9], "stop")) == APPLIED
    assert col.turn(0) == (1, (5, 9), "stop")
    assert col.take() is None  # not done until the environment says so
    col.observe(0, (), done=True, reward=0.25)
    (sample,) = col.take().groups[0].samples
    assert sample.output_ids == (3, 4, 9, 7, 7, 5, 9)
    assert sample.model_mask == (True, True, True, False, False, True, True)
    assert sample.output_logprobs[3:5] == (0.0, 0.0)
    assert (sample.turns, sample.answer_start, sample.finish_reason, sample.environment_reward) == (2, 5, "stop", 0.25)
    assert col.tokens == 5  # observations are not generated tokens


def test_a_turn_reported_again_is_a_duplicate_and_tokens_after_it_are_refused():
    col = collector()
    col.apply(delta(0, [3, 9], "stop"))
    assert col.apply(delta(0, [3, 9], "stop")) == DUPLICATE  # an export after the poll: still one turn
    assert col.take_turn_ends() == [0]
    with pytest.raises(ProtocolError):
        col.apply(delta(2, [4]))


def test_a_trim_keeps_earlier_turns_and_observations():
    col = collector()
    col.apply(delta(0, [3, 9], "stop"))
    col.take_turn_ends()
    col.observe(0, (7,), done=False)
    col.apply(delta(3, [5, 6]))
    assert col.trim(0, 1) == 2 and col.progress(0) == 3


def test_a_trim_to_the_prompt_restarts_the_episode():
    col = collector()
    col.apply(delta(0, [3, 9], "stop"))
    col.take_turn_ends()
    col.observe(0, (7,), done=False)
    col.apply(delta(3, [5, 6]))
    assert col.trim(0, 0) == 5 and col.progress(0) == 0
    col.apply(delta(0, [3, 9], "stop"))
    assert col.turn(0) == (0, (3, 9), "stop")  # the first turn again: the host answers it from its record


def test_single_turn_samples_are_unchanged():
    col = collector(episodes=False)
    col.apply(delta(0, [3, 9], "stop"))
    (sample,) = col.take().groups[0].samples
    assert (sample.model_mask, sample.turns, sample.answer_start) == ((), 0, 0)
