"""Restarting a run inside its driver: after a recoverable failure (the controller or a
trainer rank died, a step failed) the run goes back to its last complete checkpoint, as a
resume does, and is launched again, at most run.max_restarts times.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from rlboost.cluster.cost import CostLedger
from rlboost.run.directory import RunDirectory
from rlboost.run.outcome import RecoverableFailure, RestartsExhausted, restart_line
from rlboost.trainer.checkpoint import read_state


@dataclass(frozen=True, slots=True)
class Restart:
    """Where the next launch starts (its first step), the costs it carries over, when (run
    clock) the reserved cluster's billing goes on, and the line that tells the user."""

    first: int
    ledger: dict
    at_s: float
    line: str


class Supervisor:
    """Counts the restarts of one driver and rewinds the run directory for each.

    A restart is billed honestly: the instance time from the checkpoint to the failure was
    spent, so the next launch carries the failed launch's instance-seconds (not the
    checkpoint's) and bills the reserved cluster through the relaunch (its machines stay
    held), while tokens count only the steps kept. Metrics and events after the
    checkpoint are dropped (those steps are redone), the clock runs on, and the restart is
    recorded as an event {"kind": "restart", cause, failed_step, checkpoint, lost_s,
    restart, max_restarts} followed by a launch record with reason "restart".
    """

    def __init__(self, run: RunDirectory, max_restarts: int, seed: int):
        self.run, self.max_restarts, self.seed = run, max_restarts, seed
        self.restarts = 0
        self._records: list[dict] = []  # this driver's restart events, kept through later rewinds

    def restart(self, failure: RecoverableFailure, ledger: CostLedger) -> Restart:
        """Rewind the run to its last checkpoint for another launch; RestartsExhausted when
        run.max_restarts restarts have been made already."""
        if self.restarts >= self.max_restarts:
            raise RestartsExhausted(failure, self.restarts, self.max_restarts) from failure
        self.restarts += 1
        run, checkpoint = self.run, failure.resume_from
        state = read_state(run.checkpoint_dir(checkpoint)) if checkpoint is not None else {}
        back_to = float(state["elapsed_s"]) if state else _start_time(run)
        now = run.elapsed()
        seconds = ledger.totals(at_s=now)["seconds"]  # the reserved cluster's up to now
        run.truncate_metrics(checkpoint or 0)
        run.truncate_events(back_to)
        for record in self._records:  # an earlier restart after this checkpoint stays on record
            if record["t"] > back_to:
                run.append_event("restart", **record)
        record = {"t": round(now, 3), "step": failure.step, "cause": str(failure), "failed_step": failure.step,
                  "checkpoint": checkpoint, "lost_s": round(max(0.0, now - back_to), 3),
                  "restart": self.restarts, "max_restarts": self.max_restarts}
        self._records.append(record)
        run.append_event("restart", **record)
        first = (checkpoint or 0) + 1
        run.record_launch("restart", first_step=first)
        if first == 1:  # no checkpoint: start over exactly as the run first did
            random.seed(self.seed)
            torch.manual_seed(self.seed)
        tokens = int(state.get("ledger", {}).get("tokens", 0)) if state else 0
        return Restart(first, {"seconds": seconds, "tokens": tokens}, now,
                       restart_line(failure, self.restarts, self.max_restarts))


def _start_time(run: RunDirectory) -> float:
    """When the run's first launch began (its launch record), 0 if unknown."""
    return next((float(e.get("t", 0.0)) for e in run.events() if e.get("kind") == "launch"), 0.0)
