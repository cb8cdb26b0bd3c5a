"""The running step as the controller's parts share it (StepState), and what one move did to
it (Outcome): parts return an Outcome instead of calling back into the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.controller.collector import Collector
from rlboost.controller.engines import Loss
from rlboost.controller.metrics import StepMeter


class StepState:
    """The running step: its samples' tokens, its tallies, and who holds the reserved instances.

    window_open: the controller may route to the reserved instances. handed_over: the
    trainer has been told (wait_window_closed returned True) that they are its own; from
    then on only lend_reserved() gives them back. reserved_needed: queued samples can run
    nowhere else, so the controller asks for them (next_microbatch returns early once).
    """

    __slots__ = ("collector", "meter", "window_open", "handed_over", "reserved_needed", "need_announced",
                 "failure", "last_progress", "delivered_last", "ending", "ahead", "router")

    def __init__(self, collector: Collector, meter: StepMeter):
        self.collector, self.meter = collector, meter
        self.window_open = True
        self.handed_over = False
        self.reserved_needed = False
        self.need_announced = False
        self.failure: BaseException | None = None
        self.last_progress = meter.started_at
        self.delivered_last = False
        self.ending = False  # end_step() has begun: nothing new is placed
        self.ahead = False  # started ahead (bounded staleness): the reserved instances have not joined yet
        self.router = None  # a step ahead's own Router (controller.ahead); None: the controller's

    def start_ahead(self) -> None:
        """The step starts while the trainer still trains the one before: the reserved
        instances are the trainer's until join_reserved()."""
        self.ahead = True
        self.window_open = False
        self.handed_over = True

    def join_reserved(self, now: float) -> None:
        """The reserved instances hold the step's version and roll out: from here the step
        is timed as one that starts now (its window, idle times, the policy's deliveries)."""
        m = self.meter
        m.early_s, m.early_tokens = now - m.started_at, self.collector.tokens
        m.started_at = self.last_progress = now
        if m.rollout_done_at is not None:  # finished during the overlap: done as the reserved join
            m.rollout_done_at = now
        self.ahead = False
        self.window_open, self.handed_over = True, False
        self.reserved_needed = self.need_announced = False

    def close_window(self, now: float, num_preemptible: int) -> None:
        """The reserved instances stop rolling out; the first close sets the step's window."""
        self.window_open = False
        if self.meter.window_closed_at is None:
            self.meter.window_closed_at = now
            self.meter.num_preemptible = num_preemptible

    def record_delivery(self, now: float, groups) -> None:
        """The trainer took a micro-batch at `now` whose groups were ready at the given
        times: `groups` holds (ready at, tokens) pairs, in the clock's seconds. Recorded for
        the window policy's slack once the trainer holds the reserved instances: after the
        window closed, or when the whole rollout finished inside it (every group then waited
        for the trainer, the plainest sign that the window ran long)."""
        if not self.handed_over or not groups:
            return
        t0 = self.meter.started_at
        self.meter.deliveries.append((now - t0, tuple(sorted((ready - t0, tokens) for ready, tokens in groups))))

    def reopen_window(self) -> None:
        """Route to the reserved instances again (the trainer has not been handed them yet)."""
        self.window_open = True
        self.meter.reopened += 1

    def lend_reserved(self) -> bool:
        """The trainer lends the reserved instances back: the window reopens and they are no
        longer the trainer's. False (nothing changes) while the window is open."""
        if self.window_open:
            return False
        self.reopen_window()
        self.handed_over = self.reserved_needed = self.need_announced = False
        return True

    def rollout_done(self, now: float, num_preemptible: int) -> None:
        self.meter.rollout_done_at = now
        if self.meter.window_closed_at is None:
            self.meter.num_preemptible = num_preemptible

    def progressed(self, instance_id: str, kind: str, tokens: int, now: float) -> None:
        """New tokens of this step arrived from an instance."""
        self.meter.add_tokens(instance_id, kind, tokens)
        self.last_progress = now


@dataclass(slots=True)
class Outcome:
    """What a move did, for its caller to carry on from: samples it finished (whose lengths
    the service learns), instances it lost (counted in the step's metrics; waiting callers
    are woken), and, for a take-back, the unfinished samples it took off their instance
    (now unassigned: the caller decides where they go)."""

    finished: list[int] = field(default_factory=list)
    lost: list[Loss] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)

    def add_loss(self, loss: Loss | None) -> None:
        if loss is not None:
            self.lost.append(loss)
