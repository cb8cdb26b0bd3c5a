"""The simulator's staleness record: each trained micro-batch's output tokens counted by lag
(the step less the weight version that made them), every token checked against its step's
window (controller.staleness). Which steps are in rollout, and where their prompts go, is the
controller's schedule (controller.ahead)."""

from __future__ import annotations

from collections import Counter

from rlboost.controller import staleness
from rlboost.sim.collector import SimBatch, SimCollector


def count_lags(col: SimCollector, batch: SimBatch, step: int, n: int, lags: Counter) -> None:
    """Add a micro-batch's output tokens to `lags` by lag (step - version); a token outside
    the step's window raises StaleSampleError, naming its sample."""
    for gid, _ in batch.groups:
        for sid in col.group_samples(gid):
            changes, length = col.changes(sid)
            staleness.check_within(changes, length, step, n, sample_id=sid)
            for lag, tokens in enumerate(staleness.staleness_histogram(step, n, [(changes, length)])):
                lags[lag] += tokens
