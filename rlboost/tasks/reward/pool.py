"""FunctionReward: a user's reward function as a RewardSource, run in a pool of worker
processes (pebble's ProcessPool), so slow rewards run in parallel and off the driver, one
call per sample (or per batch of reward_batch_size samples) with a timeout per call.

A call that runs past its timeout has its worker killed and replaced: the samples of the
call score 0 as "timeout", and the others go on. A worker that dies (a crash, os._exit)
scores its call's samples 0 as "worker died". Each sample is pickled here, before it is
handed to the pool: one that cannot be (a row nested past the pickler's depth) scores 0 as
"unsendable", and nothing the pool's own threads send can fail. A pool that broke anyway is
replaced at the next call.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import pickle
import time
import weakref
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Sequence

from rlboost.tasks.reward.plugin import RewardTarget, load_function
from rlboost.tasks.reward.records import TIMEOUT, UNSENDABLE, WORKER_DIED, RewardRequest, RewardResult
from rlboost.tasks.reward.worker import Item, call_reward

log = logging.getLogger(__name__)
POOL_GRACE_S = 30.0  # beyond the calls' own timeouts, before a pool that answers nothing counts as broken


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
        self._stuck = False

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(requests)
        sendable: list[tuple[int, bytes]] = []
        for i, request in enumerate(requests):
            try:
                sendable.append((i, pickle.dumps(_item(request), protocol=pickle.HIGHEST_PROTOCOL)))
            except Exception as e:  # RecursionError for a row nested too deep, TypeError for a lock, ...
                results[i] = RewardResult.failing(UNSENDABLE, f"sample {request.metadata.get('sample_id', i)}: its row "
                                                              f"cannot be sent to a reward worker ({type(e).__name__})")
        batches = [sendable[start:start + self.batch_size] for start in range(0, len(sendable), self.batch_size)]
        calls = self._submit([[data for _, data in batch] for batch in batches])
        deadline = time.monotonic() + self.timeout_s * (math.ceil(len(calls) / self.workers) + 1) + POOL_GRACE_S
        self._stuck = False
        for batch, future in zip(batches, calls):
            for (i, _), result in zip(batch, self._collect(future, len(batch), deadline)):
                results[i] = result
        if self._stuck:
            log.warning("the reward pool of %s stopped answering; a new one is started", self.target.label)
            self._replace_pool()
        return results  # type: ignore[return-value]  (every slot is filled)

    def _submit(self, payloads: list[list[bytes]]) -> list:
        """One future per payload; a pool that broke (its scheduler thread died) is replaced once."""
        for attempt in (1, 2):
            pool = self._start()
            try:
                return [pool.submit(call_reward, self.timeout_s, self.target, p) for p in payloads]
            except RuntimeError:  # pebble: "Unexpected error within the Pool" or "not active"
                if attempt == 2:
                    raise
                self._replace_pool()
        return []

    def _collect(self, future, n: int, deadline: float) -> list[RewardResult]:
        from pebble import ProcessExpired

        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            if future.done():  # the pool's own timeout: the call ran too long, its worker was replaced
                return [RewardResult.failing(TIMEOUT, f"{self.target.label} ran past task.reward_timeout_s="
                                                      f"{self.timeout_s:g} s")] * n
            self._stuck = True
            return [RewardResult.failing(TIMEOUT, f"{self.target.label}: the reward pool stopped answering")] * n
        except ProcessExpired as e:
            return [RewardResult.failing(WORKER_DIED, f"{self.target.label}: {e}")] * n
        except Exception as e:  # what the call could not carry back
            return [RewardResult.failing(type(e).__name__, str(e) or repr(e))] * n

    def _start(self):
        if self._pool is not None and not self._pool.active:
            log.warning("reward pool of %s broke; a new one is started", self.target.label)
            self._replace_pool()
        if self._pool is None:
            from pebble import ProcessPool

            self._pool = ProcessPool(max_workers=self.workers, context=multiprocessing.get_context("forkserver"))
            self._finalizer = weakref.finalize(self, _stop, self._pool)
        return self._pool

    def _replace_pool(self) -> None:
        self.close()

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
