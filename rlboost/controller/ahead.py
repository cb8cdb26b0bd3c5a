"""StepsAhead: the schedule of bounded staleness (controller.max_staleness N >= 1).

Steps after the running one are in rollout too, a lane each (the step's state, collector and
own router). Under the free-slots schedule a lane opens for the next step as soon as every
earlier step's prompts are placed, if staleness.open_steps allows the step at the newest
published version (up to N ahead of it) and some engine may start it on the version it holds
(staleness.may_start); any engine with a free slot then takes the earliest lane's queued
prompts, the reserved ones too while the running step's window is open. A later lane's
prompts wait until every earlier step's are placed, and the running step's always come first.
Under the after-rollout schedule only one step runs ahead, opened once the trainer has taken
the running step's last micro-batch, on preemptible engines only.

StepRound.place_ahead carries the schedule out through its Mover, so the live controller and
the simulator place the steps ahead by this code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from rlboost.controller import staleness
from rlboost.controller.estimates import LengthModel
from rlboost.controller.metrics import StepMeter
from rlboost.controller.registry import ACTIVE, DRAINING, Registry
from rlboost.controller.router import Assign, InstanceView, Router, RouterConfig
from rlboost.controller.step import StepState

FREE_SLOTS, AFTER_ROLLOUT = "free_slots", "after_rollout"
SCHEDULES = (FREE_SLOTS, AFTER_ROLLOUT)


class Lane:
    """A step ahead of the running one whose prompts are in rollout: its state and router."""

    __slots__ = ("step", "st", "router")

    def __init__(self, step: int, st: StepState, router: Router):
        self.step, self.st, self.router = step, st, router


class StepsAhead:
    """The lanes ahead, in step order, the rules that open them, and where their prompts go.

    table: what the engine table answers (``iid in table``, ``table.rates(iid)``); schedule:
    FREE_SLOTS or AFTER_ROLLOUT (see the module's docstring)."""

    def __init__(self, max_staleness: int, *, registry: Registry, table, router: RouterConfig,
                 lengths: LengthModel, poll_interval_s: float, schedule: str = FREE_SLOTS,
                 last_step: int | None = None):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.n, self.schedule, self.last_step = max_staleness, schedule, last_step
        self.registry, self.table, self.router_config = registry, table, router
        self.lengths, self.poll_interval_s = lengths, poll_interval_s
        self.items: list[Lane] = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Lane:
        return self.items[i]

    def of(self, sid: int) -> Lane | None:
        """The lane whose step holds the sample."""
        for lane in self.items:
            if sid in lane.st.collector:
                return lane
        return None

    def holding(self, st: StepState) -> Lane | None:
        """The lane of a step state (None: it is not a step ahead)."""
        return next((lane for lane in self.items if lane.st is st), None)

    def first(self, step: int) -> Lane | None:
        """The lane of `step` if it is the next one, else None."""
        return self.items[0] if self.items and self.items[0].step == step else None

    def promote(self, step: int) -> Lane | None:
        """The lane of `step` leaves the lanes (the trainer starts the step), if there is one."""
        lane = self.first(step)
        if lane is not None:
            self.items.pop(0)
        return lane

    # -- the rules -------------------------------------------------------------------------------

    def next_step(self, running: int) -> int:
        """The step the next lane would hold, `running` being the trainer's step."""
        return running + len(self.items) + 1

    def may_open(self, running: int, reserved: bool, running_taken: bool) -> bool:
        """Whether the next lane may open now: the schedule allows another one, the step is
        open at the newest published version, and some engine may start it on what it holds.
        running_taken: the trainer has taken the running step's last micro-batch."""
        step = self.next_step(running)
        if self.last_step is not None and step > self.last_step:
            return False
        if self.schedule == AFTER_ROLLOUT and (self.items or not running_taken):
            return False
        if step not in staleness.open_steps(self.registry.current_version, self.n):
            return False
        return any(staleness.may_start(r.weight_version, step, self.n) for r in self.registry.routable()
                   if self._reserved_ok(r, reserved))

    def open(self, step: int, collector, now: float, *, weight_version: int | None = None) -> Lane:
        """Open the lane of `step` (trained on weight_version, by default the step's number)
        with the step's collector; its samples wait in its own router."""
        if self.items and step != self.items[-1].step + 1:
            raise ValueError(f"step {step} cannot follow the lanes of steps {[x.step for x in self.items]}")
        router = Router(self.router_config)
        router.begin_step(collector.sample_ids)
        version = step if weight_version is None else weight_version
        st = StepState(collector, StepMeter(step=step, weight_version=version, started_at=now))
        st.start_ahead()  # the reserved instances are the trainer's until the step starts
        st.router = router
        lane = Lane(step, st, router)
        self.items.append(lane)
        return lane

    def _reserved_ok(self, rec, reserved: bool) -> bool:
        return rec.kind != "reserved" or (reserved and self.schedule == FREE_SLOTS)

    # -- placement ---------------------------------------------------------------------------------

    def held(self, routers: Iterable[Router]) -> Counter:
        """Samples each engine holds over the given routers (the running step's, earlier lanes')."""
        out: Counter = Counter()
        for router in routers:
            for rec in self.registry.live():
                out[rec.instance_id] += len(router.samples_on(rec.instance_id))
        return out

    def views(self, lane: Lane, held: Counter, reserved: bool) -> list[InstanceView]:
        """Engines that may start the lane's step, with the slots that samples of earlier
        steps (`held`) leave them; a draining one only for samples that fit before its drain
        time; the reserved ones only when `reserved` (the running step's window is open)."""
        views = []
        for rec in self.registry.live():
            iid = rec.instance_id
            if (iid not in self.table or rec.state not in (ACTIVE, DRAINING) or not self._reserved_ok(rec, reserved)
                    or not self.registry.takes_work(rec)
                    or not staleness.may_start(rec.weight_version, lane.step, self.n)):
                continue
            room = rec.info.capacity - held[iid]  # the lane's own samples there count in the router
            left = self.registry.time_left_s(rec)
            if room <= len(lane.router.samples_on(iid)) or (left is not None and not self.table.rates(iid).observed):
                continue
            if left is not None:
                left -= self.poll_interval_s
            views.append(InstanceView(iid, room, self.table.rates(iid), True, rec.info.max_model_len, left))
        return views

    def dispatch(self, lane: Lane, views: list[InstanceView]) -> list[Assign]:
        """Where the lane's queued prompts start now (the router's placement, by expected work)."""
        col = lane.st.collector
        remaining: Callable[[int], float] = lambda sid: self.lengths.expected_remaining(col.progress(sid),  # noqa: E731
                                                                                         col.max_new(sid))
        return lane.router.dispatch(views, remaining, col.max_length, lambda sid: col.max_new(sid) - col.progress(sid),
                                    col.position)
