"""The environment host in this process: each tool call executes once whatever repeats it (a
turn re-sent after a migration, a duplicate that comes while the call executes), calls out
of order or under a reused key are refused one by one, and a faulty environment ends its own
episode only. Deterministic: an execution in flight is held by a gate the test opens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import envs_for_tests as fixtures
import pytest

from rlboost.environments import EnvironmentConfig, ModelTurn, ToolCall, call_id
from rlboost.environments.host import EnvironmentHost
from rlboost.errors import EpisodeError, ToolCallConflict
from rlboost.tasks.base import Problem

HERE = Path(__file__).parent / "envs_for_tests.py"


def _host(cls: str = "EchoEnvForTests", **config) -> EnvironmentHost:
    """A host of the test environments, named by module so the host and the test share their
    counters and gates (test_host_actor.py names them by path, as a user may)."""
    options = config.pop("options", {})
    return EnvironmentHost(EnvironmentConfig(name=f"envs_for_tests:{cls}", options=options, **config))


def _call(sample: int, turn: int, text: str = "go", *, ids: tuple[int, ...] = (1, 2)) -> ToolCall:
    return ToolCall(sample_id=sample, turn=turn, call_id=call_id(sample, turn),
                    model_turn=ModelTurn(text=text, token_ids=ids))


def _problem(pid: int) -> Problem:
    return Problem(problem_id=pid, prompt=f"p{pid}", answer="0")


def test_a_turn_sent_again_after_a_migration_gets_the_recorded_result_without_executing():
    async def episode():
        host = _host()
        first = await host.reset(1, _problem(101))
        again = await host.reset(1, _problem(101))  # the new engine's driver starts over
        a = await host.step(_call(1, 0))
        b = await host.step(_call(1, 0))  # the same turn, re-sent by the engine the sample moved to
        c = await host.step(_call(1, 1, "done"))
        return host, first, again, a, b, c

    host, first, again, a, b, c = asyncio.run(episode())
    assert (first.text, first.replayed, again.text, again.replayed) == ("start p101", False, "start p101", True)
    assert (a.replayed, b.replayed, a.record, c.record.result.done) == (False, True, b.record, True)
    assert a.record.result.observation == "seen 0" and c.record.result.reward == 1.0
    assert fixtures.EXECUTED[(101, 0)] == 1 and fixtures.EXECUTED[(101, 1)] == 1
    stats = host.stats()
    assert (stats.executions, stats.resets, stats.replays, stats.executions_by_sample) == (2, 1, 2, {1: 2})


def test_a_duplicate_that_comes_while_the_call_executes_waits_for_that_execution():
    async def duplicates():
        host = _host(options={"gate": "duplicates"})
        entered, release = fixtures.gate("duplicates")
        await host.reset(2, _problem(102))
        first = asyncio.create_task(host.step(_call(2, 0)))
        assert await asyncio.to_thread(entered.wait, 60)  # the step is inside the environment now
        second = asyncio.create_task(host.step(_call(2, 0)))
        await asyncio.sleep(0)  # the duplicate runs up to its wait on the execution in flight
        joined = host.stats().joined
        release.set()
        return host, joined, await first, await second

    host, joined, first, second = asyncio.run(duplicates())
    assert joined == 1
    assert (first.replayed, second.replayed, first.record) == (False, True, second.record)
    assert fixtures.EXECUTED[(102, 0)] == 1 and host.stats().executions == 1


def test_calls_out_of_order_or_under_a_reused_key_are_refused_and_the_episode_goes_on():
    async def refusals():
        host = _host()
        with pytest.raises(EpisodeError, match="never reset"):
            await host.step(_call(3, 0))
        await host.reset(3, _problem(103))
        with pytest.raises(EpisodeError, match="turn 1 came before turn 0"):
            await host.step(_call(3, 1))
        await host.step(_call(3, 0))
        with pytest.raises(ToolCallConflict, match="other tokens"):
            await host.step(_call(3, 0, ids=(9, 9)))
        with pytest.raises(ToolCallConflict, match="other call id"):
            await host.step(ToolCall(sample_id=3, turn=0, call_id="another", model_turn=ModelTurn(
                text="go", token_ids=(1, 2))))
        with pytest.raises(ToolCallConflict, match="problem 103, not 999"):
            await host.reset(3, _problem(999))
        done = await host.step(_call(3, 1, "done"))
        with pytest.raises(EpisodeError, match="ended at turn 1"):
            await host.step(_call(3, 2))
        await host.close(3)
        with pytest.raises(EpisodeError, match="was closed"):
            await host.step(_call(3, 1, "done"))
        return host, done

    host, done = asyncio.run(refusals())
    assert done.record.result.done and host.stats().executions == 2 and host.stats().live == 0


@pytest.mark.parametrize("cls,kind", [("RaisingEnvForTests", "KeyError"), ("WrongTypeEnvForTests", "bad result")])
def test_an_environment_that_fails_ends_its_episode_counted_by_kind(cls, kind):
    async def faulty():
        host = _host(cls)
        await host.reset(4, _problem(104))
        reply = await host.step(_call(4, 0))
        again = await host.step(_call(4, 0))
        return host, reply, again

    host, reply, again = asyncio.run(faulty())
    assert (reply.record.result.failure, reply.record.result.done, again.replayed) == (kind, True, True)
    assert host.stats().failures_by_kind == {kind: 1} and host.stats().executions == 1


def test_a_step_that_hangs_ends_as_a_timeout_and_its_environment_closes_after_it():
    async def hanging():
        host = _host(options={"gate": "hangs"}, step_timeout_s=0.5)
        entered, release = fixtures.gate("hangs")
        await host.reset(5, _problem(105))
        await host.reset(6, _problem(106))
        hung = await host.step(_call(5, 0))  # held past the timeout: the gate stays shut
        await host.close(5)
        closed_while_held = fixtures.closed(105).is_set()
        release.set()  # the hung step returns; its environment closes after it, on its thread
        closed_after = await asyncio.to_thread(fixtures.closed(105).wait, 60)
        other = await host.step(_call(6, 0))
        return host, hung, closed_while_held, closed_after, other

    host, hung, closed_while_held, closed_after, other = asyncio.run(hanging())
    assert (hung.record.result.failure, hung.record.result.done) == ("timeout", True)
    assert not closed_while_held and closed_after
    assert other.record.result.observation == "seen 0"
    assert host.stats().failures_by_kind == {"timeout": 1}
    host.shutdown()


def test_max_turns_ends_the_episode_and_max_environments_bounds_the_host():
    async def bounded():
        host = _host(max_turns=2, max_environments=1)
        await host.reset(7, _problem(107))
        with pytest.raises(EpisodeError, match="max_environments"):
            await host.reset(8, _problem(108))
        await host.step(_call(7, 0))
        last = await host.step(_call(7, 1))
        await host.close(7)
        await host.reset(8, _problem(108))
        return host, last

    host, last = asyncio.run(bounded())
    assert (last.record.result.done, last.record.result.observation) == (True, "")
    assert host.stats().truncated == 1 and host.stats().live == 1


@pytest.mark.parametrize("name,options,says", [
    (f"{HERE}:Missing", {}, "has no 'Missing'"),
    (f"{HERE}:EXECUTED", {}, "is a Counter; it must be a class with reset(problem) and step(turn)"),
    (f"{HERE}:EchoEnvForTests", {"colour": "red"}, "cannot be made with ['colour']"),
    ("nowhere/envs.py:Env", {}, "does not exist"),
    ("no_such_module_here:Env", {}, "No module named 'no_such_module_here'"),
])
def test_a_user_environment_that_cannot_be_made_is_one_line_at_start(name, options, says):
    with pytest.raises(ValueError) as err:
        EnvironmentHost(EnvironmentConfig(name=name, options=options))
    assert says in str(err.value) and "environment." in str(err.value) and "\n" not in str(err.value)
