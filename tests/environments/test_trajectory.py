"""A trajectory holds every token of an episode with a mask of the model's tokens (the only
ones trained on), their versions and log-probabilities, and the recorded tool results; it
refuses what would make those disagree."""

from __future__ import annotations

import pytest

from rlboost.environments import EnvironmentHandle, StepResult, ToolRecord, Trajectory, turn_seed
from rlboost.environments.trajectory import NOT_MODEL

HANDLE = EnvironmentHandle(host="rlboost-environments", sample_id=7, environment="calculator")


def _record(turn: int, observation: str = "8", done: bool = False) -> ToolRecord:
    return ToolRecord(turn=turn, call_id=f"7/{turn}", result=StepResult(observation=observation, done=done))


def test_an_episode_of_two_turns_masks_exactly_the_model_tokens():
    t = Trajectory.start(HANDLE, (257, 51, 43, 53, 61))
    t = t.with_model_turn((91, 51, 43, 53, 93), (-0.5,) * 5, weight_version=3)
    t = t.with_observation(_record(0), (56,))
    assert t.context == (257, 51, 43, 53, 61, 91, 51, 43, 53, 93, 56) and t.turn == 1 and not t.done
    t = t.with_model_turn((56, 258), (-0.25, -0.125), weight_version=3)
    t = t.with_observation(_record(1, "", done=True), ())
    assert t.done and t.turn == 2 and len(t.tool_results) == 2
    assert t.model_mask == (False,) * 5 + (True,) * 5 + (False,) + (True,) * 2
    assert [v for v, m in zip(t.versions, t.model_mask) if m] == [3] * 7
    assert set(v for v, m in zip(t.versions, t.model_mask) if not m) == {NOT_MODEL}
    assert t.logprobs[-2:] == (-0.25, -0.125) and t.logprobs[10] == 0.0 and t.model_tokens == 7
    with pytest.raises(ValueError, match="has ended"):
        t.with_model_turn((1,), (0.0,), weight_version=3)


def test_a_turn_across_a_weight_update_keeps_each_tokens_version():
    t = Trajectory.start(HANDLE, (1, 2)).with_model_turn((5, 6, 7), (-1.0,) * 3, weight_version=4,
                                                         versions=(3, 3, 4))
    assert t.versions == (NOT_MODEL, NOT_MODEL, 3, 3, 4)


def test_records_that_disagree_are_refused():
    t = Trajectory.start(HANDLE, (1, 2))
    with pytest.raises(ValueError, match="one logprob"):
        t.with_model_turn((5, 6), (-1.0,), weight_version=1)
    with pytest.raises(ValueError, match="the answer is to turn 3"):
        t.with_model_turn((5,), (-1.0,), weight_version=1).with_observation(_record(3), (9,))
    with pytest.raises(ValueError, match="differ in length"):
        Trajectory(handle=HANDLE, token_ids=(1, 2), model_mask=(False,), logprobs=(0.0, 0.0),
                   versions=(NOT_MODEL, NOT_MODEL), prompt_len=1)
    with pytest.raises(ValueError, match="needs a weight version"):
        Trajectory(handle=HANDLE, token_ids=(1, 2), model_mask=(False, True), logprobs=(0.0, 0.0),
                   versions=(NOT_MODEL, NOT_MODEL), prompt_len=1)
    with pytest.raises(ValueError, match="format_version"):
        Trajectory(handle=HANDLE, token_ids=(1,), model_mask=(False,), logprobs=(0.0,), versions=(NOT_MODEL,),
                   prompt_len=1, format_version=99)


def test_each_turn_draws_with_its_own_seed_the_same_on_every_engine():
    seeds = [turn_seed(1234, turn) for turn in range(8)]
    assert seeds[0] == 1234 and len(set(seeds)) == 8 and all(0 <= s < 2**64 for s in seeds)
    assert seeds == [turn_seed(1234, turn) for turn in range(8)]
