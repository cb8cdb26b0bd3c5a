"""A user's reward function behind the RewardSource interface: plain, async and batched
functions; a call that raises, hangs past its timeout, returns a non-number or kills its
worker scores 0 with its kind, and the others are scored; names that do not resolve are
one line before anything runs."""

from __future__ import annotations

import os
import pickle
import textwrap
import threading

import pytest

from rlboost.errors import RewardsFailed
from rlboost.tasks.base import Problem
from rlboost.tasks.reward.ledger import RewardLedger
from rlboost.tasks.reward.plugin import RewardTarget
from rlboost.tasks.reward.pool import FunctionReward
from rlboost.tasks.reward.records import RewardRequest, RewardResult, read_value

pytest.importorskip("pebble")

MODULE = textwrap.dedent('''
    import asyncio, os, time

    def plain(prompt, completion, row, metadata):
        kind = row["kind"]
        if kind == "raise":
            raise KeyError("no verifier for this")
        if kind == "hang":
            time.sleep(120)
        if kind == "text":
            return "1.0"
        if kind == "nan":
            return float("nan")
        if kind == "exit":
            # Mid-call, as a crash is, once the pool has marked the call started (the gate):
            # pebble sees a worker that dies before the pool has read its start message as
            # idle, and then reports that call as a timeout instead.
            with open(row["gate"]) as gate:
                gate.read(1)
            os._exit(7)
        if kind == "no_score":
            return {"correct": 1.0}
        return {"score": float(completion == row["answer"]), "length": len(completion)}

    async def later(prompt, completion, row, metadata):
        await asyncio.sleep(0.01)
        return 0.25

    def many(prompts, completions, rows, metadata):
        return [len(c) for c in completions]

    def short(prompts, completions, rows, metadata):
        return [1.0]

    def needs_more(prompt, completion):
        return 1.0
''')


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "user_rewards.py"
    path.write_text(MODULE)
    return path


def _requests(kinds, gate=""):
    return [RewardRequest(problem=Problem(problem_id=i, prompt="2+2=", answer="4",
                                          row={"kind": k, "answer": "4", "gate": gate}),
                          completion="4", metadata={"sample_id": i}) for i, k in enumerate(kinds)]


@pytest.fixture
def started_gate(tmp_path, monkeypatch):
    """A FIFO the "exit" call reads before its worker dies: written once the pool has marked
    that call started (pebble's Task.set_running_or_notify_cancel, on the pool's thread)."""
    from pebble.pool.base_pool import Task

    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    real = Task.set_running_or_notify_cancel

    def running(task):
        out = real(task)
        # each item travels pickled by the driver: (prompt, completion, row, metadata)
        if any(pickle.loads(item)[2].get("kind") == "exit" for item in task.payload.args[-1]):
            threading.Thread(target=lambda: fifo.write_text("x"), daemon=True).start()  # blocks until read
        return out
    monkeypatch.setattr(Task, "set_running_or_notify_cancel", running)
    return str(fifo)


def test_every_kind_of_failure_scores_zero_and_the_rest_is_scored(module, started_gate):
    kinds = ["ok", "raise", "hang", "text", "nan", "exit", "no_score", "ok"]
    with FunctionReward(RewardTarget.parse(f"{module}:plain"), workers=2, timeout_s=1.5) as rewards:
        results = rewards.score(_requests(kinds, started_gate))
        again = rewards.score(_requests(["ok", "ok"]))  # the pool replaced its killed workers
    by_kind = dict(zip(kinds, results))
    assert by_kind["ok"] == RewardResult(score=1.0, parts={"length": 1.0})
    assert results[-1].score == 1.0
    assert (by_kind["raise"].failure, by_kind["raise"].score) == ("KeyError", 0.0)
    assert "no verifier" in by_kind["raise"].error
    assert by_kind["hang"].failure == "timeout" and "reward_timeout_s=1.5" in by_kind["hang"].error
    assert by_kind["text"].failure == by_kind["nan"].failure == by_kind["no_score"].failure == "not a number"
    assert by_kind["exit"].failure == "worker died"
    assert [r.score for r in again] == [1.0, 1.0]


def test_async_and_batched_functions(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a module of the current directory, by name
    with FunctionReward(RewardTarget.parse("user_rewards:later"), workers=1, timeout_s=10) as rewards:
        assert [r.score for r in rewards.score(_requests(["ok"] * 3))] == [0.25] * 3
    batched = RewardTarget.parse("user_rewards.py:many", batched=True)
    with FunctionReward(batched, workers=2, timeout_s=10, batch_size=4) as rewards:
        assert [r.score for r in rewards.score(_requests(["ok"] * 10))] == [1.0] * 10
    with FunctionReward(RewardTarget.parse("user_rewards:short", batched=True), workers=1, timeout_s=10,
                        batch_size=3) as rewards:
        results = rewards.score(_requests(["ok"] * 3))
        assert {r.failure for r in results} == {"not a number"} and "1 results for 3" in results[0].error


@pytest.mark.parametrize("spec,batched,says", [
    ("user_rewards:missing", False, "has no 'missing' (it has ['later', 'many', 'needs_more', 'plain', 'short'])"),
    ("no_such_module_here:f", False, "No module named 'no_such_module_here'"),
    ("user_rewards", False, "must be 'package.module:function'"),
    ("user_rewards:needs_more", False, "cannot be called as a reward with keywords prompt, completion, row, metadata"),
    ("user_rewards:plain", True, "cannot be called as a batched reward"),
    ("nowhere/rewards.py:f", False, "does not exist"),
])
def test_a_reward_that_cannot_be_called_is_one_line_at_start(module, tmp_path, monkeypatch, spec, batched, says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        FunctionReward(RewardTarget.parse(spec, batched=batched), workers=1, timeout_s=1)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_read_value_takes_numbers_and_dicts_with_a_score():
    assert read_value(1).score == 1.0 and read_value(True).score == 1.0
    assert read_value({"score": 0.5, "format": 1}).parts == {"format": 1.0}
    for bad in ("1", None, [1.0], {"score": "high"}, {"score": 1.0, "part": "x"}, float("inf")):
        with pytest.raises(ValueError):
            read_value(bad)


def test_the_ledger_counts_per_step_logs_each_kind_once_and_stops_a_step_that_all_failed(caplog):
    ledger = RewardLedger("user_rewards:plain")
    ledger.add([RewardResult(score=1.0, parts={"format": 1.0}), RewardResult.failing("KeyError", "first"),
                RewardResult.failing("KeyError", "second"), RewardResult(score=0.0, parts={"format": 0.0})])
    ledger.check_step(1)
    step1 = ledger.take()
    assert step1 == {"reward_failures": 2, "reward_failures_by_kind": {"KeyError": 2},
                     "reward_parts": {"format": 0.5}, "reward_errors": {"KeyError": "first"}}
    ledger.add([RewardResult.failing("KeyError", "third"), RewardResult.failing("timeout", "slow")])
    with pytest.raises(RewardsFailed, match=r"every reward of step 2 failed \(user_rewards:plain: 1 KeyError, "
                                            r"1 timeout\); first error: first"):
        ledger.check_step(2)
    assert ledger.take()["reward_errors"] == {"timeout": "slow"}  # KeyError was logged in step 1
    assert sum("KeyError" in r.message for r in caplog.records) == 1


def test_a_step_whose_every_reward_failed_stops(module):
    from rlboost.controller.records import CompletedGroup, CompletedSample, GroupBatch
    from rlboost.migration.state import SamplingParams
    from rlboost.models import ByteTokenizer
    from rlboost.tasks.arithmetic import ArithmeticTask
    from rlboost.trainer.feed import TaskFeed

    tok = ByteTokenizer()
    rewards = FunctionReward(RewardTarget.parse(f"{module}:plain"), workers=1, timeout_s=5)  # row has no "kind"
    feed = TaskFeed(ArithmeticTask(), tok, groups_per_step=1, group_size=2, rewards=rewards, reward_label="plain",
                    params=SamplingParams(max_new_tokens=4, stop_token_ids=(tok.eos_id,)))
    group = feed.groups(1)[0]
    done = CompletedGroup(group_id=group.group_id, prompt_ids=group.prompt_ids, samples=tuple(
        CompletedSample(sample_id=group.group_id * 65536 + j, output_ids=(52, tok.eos_id), output_logprobs=(-0.5, -0.1),
                        finish_reason="stop", weight_version=1) for j in range(2)))
    with pytest.raises(RewardsFailed, match="every reward of step 1 failed .plain: 2 KeyError"):
        feed.score(GroupBatch(step=1, groups=(done,), last=True))
    feed.close()
