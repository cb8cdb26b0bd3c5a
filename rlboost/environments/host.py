"""EnvironmentHost: the environments of a run's episodes, one per sample, kept off the rollout
instances (a Ray actor on a reserved or CPU-only node: rlboost.cluster.environment_host), so
a preemption loses generation state only.

Every call runs at most once. A step is keyed by (sample, turn, call id): the same call
again (a turn re-sent by the engine a sample migrated to) gets the recorded result; a call
that comes while the same call is executing waits for that execution. Calls out of turn
order, for an episode that ended, or under a reused key with other content are typed errors
(EpisodeError, ToolCallConflict) for that call only. An environment that raises, hangs past
step_timeout_s or answers with something else ends its episode as a failure, counted by
kind; the host and every other episode go on. Environments run on worker threads; the
host's bookkeeping runs on its event loop only, so it needs no lock.

Usage (an asyncio caller, or the same methods through a Ray actor handle):
    opening = await host.reset(sample_id, problem)          # EpisodeOpening
    reply = await host.step(ToolCall(sample_id=..., turn=..., call_id=..., model_turn=...))
    await host.close(sample_id)                              # once the trajectory is finished
    host.stats()                                             # HostStats
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from rlboost.environments.base import StepResult
from rlboost.environments.config import EnvironmentConfig
from rlboost.environments.factory import environment_kind
from rlboost.environments.records import EpisodeOpening, HostStats, ToolCall, ToolReply
from rlboost.environments.trajectory import ToolRecord
from rlboost.errors import EpisodeError, ToolCallConflict
from rlboost.tasks.base import Problem

TIMEOUT, BAD_RESULT = "timeout", "bad result"


@dataclass(slots=True)
class _Episode:
    env: Any
    problem_id: int
    opening: EpisodeOpening | None
    records: dict[int, tuple[ToolRecord, tuple[int, ...]]] = field(default_factory=dict)  # turn -> record, ids
    next_turn: int = 0
    done: bool = False
    executions: int = 0
    last_call: Future | None = None  # the environment's last call on a worker thread


class EnvironmentHost:
    """The environments of one run (see the module docstring). name: how trajectories' handles
    name this host."""

    def __init__(self, config: EnvironmentConfig, *, name: str = "rlboost-environments"):
        self.config, self.name = config, name
        self.kind = environment_kind(config)
        self._pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="rlboost-env")
        self._episodes: dict[int, _Episode] = {}
        self._closed: set[int] = set()
        self._pending: dict[tuple, tuple[Any, asyncio.Future]] = {}  # key -> (what was asked, its outcome)
        self._counts: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._close_lock = threading.Lock()
        self._close_failures: Counter[str] = Counter()  # written by worker threads

    async def reset(self, sample_id: int, problem: Problem) -> EpisodeOpening:
        """Start the sample's episode, or answer from the record when it has started."""
        if sample_id in self._closed:
            raise EpisodeError(f"sample {sample_id}: its episode was closed")
        episode = self._episodes.get(sample_id)
        if episode is not None:
            if episode.problem_id != problem.problem_id:
                raise ToolCallConflict(f"sample {sample_id}: its episode started with problem {episode.problem_id}, "
                                       f"not {problem.problem_id}")
            self._counts["replays"] += 1
            return dataclasses.replace(episode.opening, replayed=True)
        key = ("reset", sample_id)
        if key in self._pending:
            return dataclasses.replace(await self._join(key, problem.problem_id, sample_id), replayed=True)
        if len(self._episodes) + sum(1 for k in self._pending if k[0] == "reset") >= self.config.max_environments:
            raise EpisodeError(f"the environment host holds {len(self._episodes)} episodes, its "
                               f"environment.max_environments; close finished ones")
        return await self._run_once(key, problem.problem_id, lambda: self._start(sample_id, problem))

    async def step(self, call: ToolCall) -> ToolReply:
        """The environment's answer to one model turn, executed at most once."""
        episode = self._episode(call.sample_id)
        recorded = episode.records.get(call.turn)
        if recorded is not None:
            self._check_same(call, *recorded)
            self._counts["replays"] += 1
            return ToolReply(record=recorded[0], replayed=True)
        key = ("step", call.sample_id, call.turn)
        if key in self._pending:
            return ToolReply(record=await self._join(key, call, call.sample_id), replayed=True)
        if episode.done:
            raise EpisodeError(f"sample {call.sample_id}: its episode ended at turn {episode.next_turn - 1}")
        if call.turn != episode.next_turn:
            raise EpisodeError(f"sample {call.sample_id}: turn {call.turn} came before turn {episode.next_turn}")
        record = await self._run_once(key, call, lambda: self._execute(episode, call))
        return ToolReply(record=record, replayed=False)

    async def close(self, sample_id: int) -> None:
        """Forget the sample's episode and release its environment (once its last call ended)."""
        self._closed.add(sample_id)
        episode = self._episodes.pop(sample_id, None)
        if episode is not None:
            self._release(episode)

    def stats(self) -> HostStats:
        c = self._counts
        return HostStats(executions=c["executions"], resets=c["resets"], replays=c["replays"], joined=c["joined"],
                         truncated=c["truncated"], live=len(self._episodes),
                         executions_by_sample={s: e.executions for s, e in self._episodes.items()},
                         failures_by_kind=dict(self._failures + self._closing_failures()))

    def _closing_failures(self) -> Counter[str]:
        with self._close_lock:
            return Counter(self._close_failures)

    def shutdown(self) -> None:
        """Release every environment and stop the worker threads (a hung one is left behind)."""
        for sample_id in list(self._episodes):
            self._release(self._episodes.pop(sample_id))
        self._pool.shutdown(wait=False, cancel_futures=False)

    async def _run_once(self, key: tuple, asked: Any, work: Callable) -> Any:
        """Run work() as the one execution of key; calls that come meanwhile wait on it."""
        outcome = asyncio.get_running_loop().create_future()
        self._pending[key] = (asked, outcome)
        try:
            result = await work()
            outcome.set_result(result)
            return result
        except BaseException as e:
            outcome.set_exception(e)
            outcome.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            del self._pending[key]

    async def _join(self, key: tuple, asked: Any, sample_id: int) -> Any:
        first, outcome = self._pending[key]
        if first != asked:
            raise ToolCallConflict(f"sample {sample_id}: {key[0]} {key[-1]} is executing for other content")
        self._counts["joined"] += 1
        return await asyncio.shield(outcome)

    async def _start(self, sample_id: int, problem: Problem) -> EpisodeOpening:
        episode = _Episode(env=None, problem_id=problem.problem_id, opening=None)
        made = await self._call(episode, self.kind.make)
        failure = made if isinstance(made, StepResult) else None
        if failure is None:
            episode.env = made
            text = await self._call(episode, made.reset, problem)
            if isinstance(text, StepResult):
                failure = text
            elif not isinstance(text, str) or not text:
                failure = StepResult.failing(BAD_RESULT, f"reset returned {type(text).__name__} "
                                                         f"{str(text)[:60]!r}, not a non-empty text")
        self._counts["resets"] += 1
        if failure is not None:
            self._failures[failure.failure] += 1
        episode.opening = EpisodeOpening(sample_id=sample_id, text="" if failure else text,
                                         tool_call=self.kind.tool_call, replayed=False,
                                         failure=failure.failure if failure else None,
                                         error=failure.error if failure else "")
        episode.done = failure is not None
        if sample_id in self._closed:  # closed while it started
            self._release(episode)
        else:
            self._episodes[sample_id] = episode
        return episode.opening

    async def _execute(self, episode: _Episode, call: ToolCall) -> ToolRecord:
        result = await self._call(episode, episode.env.step, call.model_turn)
        if not isinstance(result, StepResult):
            result = StepResult.failing(BAD_RESULT, f"step returned {type(result).__name__}, not a StepResult")
        if not result.done and call.turn + 1 >= self.config.max_turns:
            result = StepResult(done=True, reward=result.reward)  # the episode's last turn: nothing to observe
            self._counts["truncated"] += 1
        if result.failed:
            self._failures[result.failure] += 1
        record = ToolRecord(turn=call.turn, call_id=call.call_id, result=result)
        episode.records[call.turn] = (record, call.model_turn.token_ids)
        episode.next_turn, episode.done = call.turn + 1, result.done
        episode.executions += 1
        self._counts["executions"] += 1
        return record

    async def _call(self, episode: _Episode, fn: Callable, *args) -> Any:
        """fn(*args) on a worker thread, bounded by step_timeout_s: its value, or a failing
        StepResult for what it raised or a timeout. The episode remembers the call, so its
        environment is closed only after it (one thread at a time, even after a timeout)."""
        future = self._pool.submit(fn, *args)
        episode.last_call = future
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.config.step_timeout_s)
        except asyncio.TimeoutError:
            return StepResult.failing(TIMEOUT, f"{self.kind.label} took longer than environment.step_timeout_s="
                                               f"{self.config.step_timeout_s:g} s")
        except Exception as e:  # the environment's own fault: its episode ends, the host goes on
            return StepResult.failing(type(e).__name__, str(e) or repr(e))

    def _check_same(self, call: ToolCall, record: ToolRecord, token_ids: tuple[int, ...]) -> None:
        if record.call_id != call.call_id or token_ids != call.model_turn.token_ids:
            what = "call id" if record.call_id != call.call_id else "tokens"
            raise ToolCallConflict(f"sample {call.sample_id}: turn {call.turn} was executed as call "
                                   f"{record.call_id!r} with other {what}; its result cannot answer this one")

    def _episode(self, sample_id: int) -> _Episode:
        episode = self._episodes.get(sample_id)
        if episode is None:
            said = "was closed" if sample_id in self._closed else "was never reset"
            raise EpisodeError(f"sample {sample_id}: its episode {said}")
        return episode

    def _release(self, episode: _Episode) -> None:
        close = getattr(episode.env, "close", None)
        if not callable(close):
            return
        if episode.last_call is None or episode.last_call.done():
            self._pool.submit(self._close_quietly, close)
        else:  # one thread at a time: on the thread of the call still running (a timed-out one), after it
            episode.last_call.add_done_callback(lambda _: self._close_quietly(close))

    def _close_quietly(self, close: Callable[[], None]) -> None:
        try:
            close()
        except Exception as e:  # on a worker thread: counted under the lock, read by stats()
            with self._close_lock:
                self._close_failures[f"close: {type(e).__name__}"] += 1
