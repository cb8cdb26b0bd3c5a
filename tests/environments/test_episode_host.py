"""The host as the episode driver speaks to it, in token ids: a turn's tokens are decoded for
the environment, its observation comes back as the next turn's prompt tokens, and the same
turn asked again is answered from the record without running the tool a second time."""

import asyncio

import pytest

from rlboost.environments.config import EnvironmentConfig
from rlboost.environments.turns import EpisodeHost, TurnAnswer
from rlboost.errors import EpisodeError
from rlboost.models.byte_tokenizer import ByteTokenizer
from rlboost.tasks.base import Problem

PROBLEM = Problem(problem_id=3, prompt="12+7=", answer="19")


@pytest.fixture
def tokenizer_dir(tmp_path):
    ByteTokenizer().save(tmp_path)
    return str(tmp_path)


def ids(text):
    return ByteTokenizer().encode(text)


def test_a_tool_call_is_answered_with_the_observation_tokens_once(tokenizer_dir):
    async def main():
        host = EpisodeHost(EnvironmentConfig(name="calculator"), tokenizer_dir=tokenizer_dir)
        try:
            assert await host.open([7, 8], PROBLEM) == "12+7="
            first = await host.answer(7, 0, ids("[12+7]"), "stop")
            again = await host.answer(7, 0, ids("[12+7]"), "stop")  # the turn re-sent after a migration
            answer = await host.answer(7, 1, ids("19"), "stop")
            return first, again, answer, host.stats()
        finally:
            host.shutdown()

    first, again, answer, stats = asyncio.run(main())
    assert first == TurnAnswer(sample_id=7, turn=0, observation_ids=tuple(ids("19")), done=False, replayed=False)
    assert again.observation_ids == first.observation_ids and again.replayed
    assert answer.done and answer.observation_ids == ()
    assert (stats.executions, stats.replays) == (2, 1)


def test_a_turn_out_of_order_is_a_typed_error(tokenizer_dir):
    async def main():
        host = EpisodeHost(EnvironmentConfig(name="calculator"), tokenizer_dir=tokenizer_dir)
        try:
            await host.open([7], PROBLEM)
            with pytest.raises(EpisodeError):
                await host.answer(7, 1, ids("19"), "stop")
            with pytest.raises(EpisodeError):
                await host.answer(9, 0, ids("19"), "stop")  # never opened
        finally:
            host.shutdown()

    asyncio.run(main())
