"""FunctionReward: a user's reward function as a RewardSource, run in a pool of worker
processes (pebble's ProcessPool), so slow rewards run in parallel and off the driver, one
call per sample (or per batch of reward_batch_size samples) with a timeout per call.

A call that runs past its timeout has its worker killed and replaced: the samples of the
call score 0 as "timeout", and the others go on. A worker that dies (a crash, os._exit)
scores its call's samples 0 as "worker died".
"""

from __future__ import annotations

import multiprocessing
import weakref
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Sequence

from rlboost.tasks.reward.plugin import RewardTarget, load_function
from rlboost.tasks.reward.records import TIMEOUT, WORKER_DIED, RewardRequest, RewardResult
from rlboost.tasks.reward.worker import Item, call_reward


class FunctionReward:
    """Usage: rewards = FunctionReward(RewardTarget.parse("my_rewards:score"), workers=4,
    timeout_s=30); rewards.score(requests) -> [RewardResult]; rewards.close().

    The function is imported here first, so a name that does not resolve or a signature
    that cannot take the arguments is a ValueError before anything runs. Workers start on
    the first score() call (forkserver: forked from a small server process, never from the
    driver with its threads).
    """

    def __init__(self, target: RewardTarget, *, workers: int, timeout_s: float, batch_size: int = 1):
        if workers < 1 or timeout_s <= 0 or batch_size < 1:
            raise ValueError(f"workers and batch_size must be >= 1 and timeout_s > 0, got "
                             f"{workers}, {batch_size}, {timeout_s}")
        load_function(target)
        self.target, self.workers, self.timeout_s = target, workers, timeout_s
        self.batch_size = batch_size if target.batched else 1
        self._pool = None
        self._finalizer = None

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        items = [_item(r) for r in requests]
        pool = self._start()
        calls = [(start, pool.submit(call_reward, self.timeout_s, self.target, items[start:start + self.batch_size]))
                 for start in range(0, len(items), self.batch_size)]
        results: list[RewardResult] = []
        for start, future in calls:
            n = min(self.batch_size, len(items) - start)
            results.extend(self._collect(future, n))
        return results

    def _collect(self, future, n: int) -> list[RewardResult]:
        from pebble import ProcessExpired

        try:
            return future.result()
        except FutureTimeout:
            return [RewardResult.failing(TIMEOUT, f"{self.target.label} ran past task.reward_timeout_s="
                                                  f"{self.timeout_s:g} s")] * n
        except ProcessExpired as e:
            return [RewardResult.failing(WORKER_DIED, f"{self.target.label}: {e}")] * n
        except Exception as e:  # what the call could not carry (an unpicklable row, ...)
            return [RewardResult.failing(type(e).__name__, str(e) or repr(e))] * n

    def _start(self):
        if self._pool is None:
            from pebble import ProcessPool

            self._pool = ProcessPool(max_workers=self.workers, context=multiprocessing.get_context("forkserver"))
            self._finalizer = weakref.finalize(self, _stop, self._pool)
        return self._pool

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._pool = self._finalizer = None

    def __enter__(self) -> FunctionReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _item(request: RewardRequest) -> Item:
    return request.problem.prompt, request.completion, request.row, dict(request.metadata)


def _stop(pool) -> None:
    pool.stop()  # kills workers still inside a call: nothing waits on them any more
    pool.join(timeout=10)
