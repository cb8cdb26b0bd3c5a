"""Environments for the host's tests (named by path, as a user names theirs): one that answers
every turn with "seen <turn>" and ends on "done", and can be held inside a step by a gate the
test opens, so concurrent calls meet an execution in flight; ones that raise, hang, or answer
with the wrong type.

Gates: `threading` events in this process (gate="name"), or a Ray actor of GateForTests
(gate_actor="name") when the host runs as an actor in another process.
"""

from __future__ import annotations

import threading
from collections import Counter

from rlboost.environments import ModelTurn, StepResult, ToolCallFormat
from rlboost.tasks.base import Problem

EXECUTED: Counter = Counter()  # (problem id, turn) -> steps executed, in this process
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}  # name -> (entered, release)
CLOSED: dict[int, threading.Event] = {}  # problem id -> set when its environment closed


def closed(problem_id: int) -> threading.Event:
    return CLOSED.setdefault(problem_id, threading.Event())


def gate(name: str) -> tuple[threading.Event, threading.Event]:
    return GATES.setdefault(name, (threading.Event(), threading.Event()))


class EchoEnvForTests:
    tool_call = ToolCallFormat(open="<", close=">")

    def __init__(self, gate: str = "", gate_actor: str = "", hold_turn: int = 0):
        self.gate, self.gate_actor, self.hold_turn = gate, gate_actor, hold_turn
        self.problem_id, self.turn = -1, 0

    def reset(self, problem: Problem) -> str:
        self.problem_id = problem.problem_id
        return f"start {problem.prompt}"

    def step(self, turn: ModelTurn) -> StepResult:
        if self.turn == self.hold_turn:
            self._hold()
        EXECUTED[(self.problem_id, self.turn)] += 1
        self.turn += 1
        if turn.text == "done":
            return StepResult(done=True, reward=1.0)
        return StepResult(observation=f"seen {self.turn - 1}", done=False)

    def _hold(self) -> None:
        if self.gate:
            entered, release = gate(self.gate)
            entered.set()
            if not release.wait(60):
                raise TimeoutError("the test never opened the gate")
        if self.gate_actor:
            import ray

            ray.get(ray.get_actor(self.gate_actor).enter_and_wait.remote(), timeout=60)

    def close(self) -> None:
        closed(self.problem_id).set()


class RaisingEnvForTests(EchoEnvForTests):
    def step(self, turn: ModelTurn) -> StepResult:
        raise KeyError("the tool's table has no such row")


class WrongTypeEnvForTests(EchoEnvForTests):
    def step(self, turn: ModelTurn) -> StepResult:
        return {"observation": "a dict, not a StepResult"}


class GateForTests:
    """A Ray actor: environments wait in enter_and_wait() until the test calls open();
    entered(n) returns once n environments have come in."""

    def __init__(self):
        import asyncio

        self._open, self._came = asyncio.Event(), asyncio.Condition()
        self.count = 0

    async def enter_and_wait(self) -> None:
        async with self._came:
            self.count += 1
            self._came.notify_all()
        await self._open.wait()

    async def entered(self, n: int) -> int:
        async with self._came:
            await self._came.wait_for(lambda: self.count >= n)
        return self.count

    async def open(self) -> None:
        self._open.set()


class ToolByParityEnvForTests:
    """An environment for episodes on a random model: a turn that stops on an even token is a
    tool call, answered with "r<its length>"; any other turn is the answer. STEPS counts every
    step executed in this process, the counter the exactly-once checks read."""

    tool_call = None  # the test's stop tokens end every turn
    STEPS: Counter = Counter()  # "steps" -> steps executed

    def reset(self, problem: Problem) -> str:
        return problem.prompt

    def step(self, turn: ModelTurn) -> StepResult:
        ToolByParityEnvForTests.STEPS["steps"] += 1
        if turn.finish_reason == "stop" and turn.token_ids[-1] % 2 == 0:
            return StepResult(observation=f"r{len(turn.token_ids)}", done=False)
        return StepResult(done=True)
