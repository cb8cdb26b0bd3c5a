"""RewardLedger: what the rewards of each step came to besides their scores: how many
samples failed and of which kind (each kind logged once per run, with its first error),
and the mean of each named part a reward function returned."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Sequence

from rlboost.errors import RewardsFailed
from rlboost.tasks.reward.records import RewardResult

log = logging.getLogger("rlboost.reward")


class RewardLedger:
    """Usage: ledger.add(results) per scored batch, ledger.check_step(step) once the step's
    last batch is scored (RewardsFailed when every one of its rewards failed), and
    ledger.take() for the step's metrics (which starts the next step's counts).

    >>> from rlboost.tasks.reward.records import RewardResult
    >>> ledger = RewardLedger("my_rewards:score")
    >>> ledger.add([RewardResult(score=1.0, parts={"format": 1.0}), RewardResult.failing("timeout", "slow")])
    >>> ledger.take()["reward_failures_by_kind"]
    {'timeout': 1}
    """

    def __init__(self, label: str):
        self.label = label
        self._seen: dict[str, str] = {}  # kind -> first error, over the whole run
        self._reset()

    def _reset(self) -> None:
        self._scored = 0
        self._failures: Counter[str] = Counter()
        self._new: dict[str, str] = {}
        self._parts: dict[str, list[float]] = {}

    def add(self, results: Sequence[RewardResult]) -> None:
        for r in results:
            self._scored += 1
            if r.failed:
                self._failures[r.failure] += 1
                if r.failure not in self._seen:
                    self._seen[r.failure] = self._new[r.failure] = r.error
                    log.warning("reward %s: %s (%s); such samples score 0, counted in metrics.jsonl as "
                                "reward_failures_by_kind", self.label, r.failure, r.error)
                continue
            for name, value in r.parts.items():
                self._parts.setdefault(name, []).append(value)

    def check_step(self, step: int) -> None:
        """RewardsFailed (one line) when the step scored samples and every one failed."""
        failed = sum(self._failures.values())
        if self._scored and failed == self._scored:
            kinds = ", ".join(f"{n} {kind}" for kind, n in self._failures.most_common())
            first = self._seen[self._failures.most_common(1)[0][0]]
            raise RewardsFailed(f"every reward of step {step} failed ({self.label}: {kinds}); first error: {first}")

    def take(self) -> dict:
        """The step's reward metrics (for metrics.jsonl), then zero them for the next step."""
        out = {"reward_failures": sum(self._failures.values()),
               "reward_failures_by_kind": dict(self._failures),
               "reward_parts": {name: sum(v) / len(v) for name, v in sorted(self._parts.items())}}
        if self._new:
            out["reward_errors"] = dict(self._new)  # the first error of each kind new this step
        self._reset()
        return out
