"""The steps ahead of the running one that a simulated controller rolls out with
controller.max_staleness N >= 1 (a lane each: the step's state, its collector and its
own router), under the rules of controller.staleness, which the real controller applies.

A lane opens for the next step when staleness.open_steps allows it at the newest published
version and an instance may start it (staleness.may_start on the version it holds); its
samples take the slots the running step and earlier lanes leave. Trained tokens are
checked against their step's window and counted by lag.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from rlboost.controller import staleness
from rlboost.controller.metrics import StepMeter
from rlboost.controller.registry import ACTIVE, DRAINING, Registry
from rlboost.controller.router import InstanceView, Router, RouterConfig
from rlboost.controller.step import StepState
from rlboost.sim.collector import SimBatch, SimCollector


class Lane:
    """A step ahead of the running one whose prompts are in rollout: its state and router."""

    __slots__ = ("step", "st", "router")

    def __init__(self, step: int, st: StepState, router: Router):
        self.step, self.st, self.router = step, st, router


class Lanes:
    """The lanes ahead, in step order, and which instances may take their samples."""

    def __init__(self, max_staleness: int, last_step: int, registry: Registry, table, router: RouterConfig,
                 poll_interval_s: float):
        self.n, self.last_step = max_staleness, last_step
        self.registry, self.table, self.router_config = registry, table, router
        self.poll_interval_s = poll_interval_s
        self.items: list[Lane] = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Lane:
        return self.items[i]

    def of(self, sid: int) -> Lane | None:
        for lane in self.items:
            if sid in lane.st.collector:
                return lane
        return None

    def first(self, step: int) -> Lane | None:
        """The lane of `step` if it is the next one, else None."""
        return self.items[0] if self.items and self.items[0].step == step else None

    def promote(self, step: int) -> Lane | None:
        """The lane of `step` leaves the lanes (the step starts), if there is one."""
        lane = self.first(step)
        if lane is not None:
            self.items.pop(0)
        return lane

    def open_next(self, running: int, make_collector: Callable[[int], SimCollector], reserved: bool) -> bool:
        """Open the lane of the step after the last one in rollout (the running step is
        `running`), if the rules open it and an instance may start it now."""
        step = running + len(self.items) + 1
        if step > self.last_step or step not in staleness.open_steps(self.registry.current_version, self.n):
            return False
        if not any(staleness.may_start(r.weight_version, step, self.n) for r in self.registry.routable()
                   if reserved or r.kind != "reserved"):
            return False
        col = make_collector(step)
        router = Router(self.router_config)
        router.begin_step(col.sample_ids)
        st = StepState(col, StepMeter(step=step, weight_version=step, started_at=self.registry.clock.now()))
        st.start_ahead()  # the reserved instances are the trainer's until the step starts
        self.items.append(Lane(step, st, router))
        return True

    def views(self, lane: Lane, held: Counter, reserved: bool) -> list[InstanceView]:
        """Instances that may start the lane's step, with the slots that samples of earlier
        steps (`held`) leave them; a draining one only for samples that fit before its drain
        time; the reserved ones only when `reserved` (the running step's window is open)."""
        views = []
        for rec in self.registry.live():
            iid = rec.instance_id
            if (iid not in self.table or rec.state not in (ACTIVE, DRAINING)
                    or (rec.kind == "reserved" and not reserved) or not self.registry.takes_work(rec)
                    or not staleness.may_start(rec.weight_version, lane.step, self.n)):
                continue
            room = rec.info.capacity - held[iid]  # the lane's own samples there included
            left = self.registry.time_left_s(rec)
            if room <= len(lane.router.samples_on(iid)) or (left is not None and not self.table.rates(iid).observed):
                continue
            if left is not None:
                left -= self.poll_interval_s
            views.append(InstanceView(iid, room, self.table.rates(iid), True, rec.info.max_model_len, left))
        return views


def count_lags(col: SimCollector, batch: SimBatch, step: int, n: int, lags: Counter) -> None:
    """Add a micro-batch's output tokens to `lags` by lag (step - version); a token outside
    the step's window raises StaleSampleError, naming its sample."""
    for gid, _ in batch.groups:
        for sid in col.group_samples(gid):
            changes, length = col.changes(sid)
            staleness.check_within(changes, length, step, n, sample_id=sid)
            for lag, tokens in enumerate(staleness.staleness_histogram(step, n, [(changes, length)])):
                lags[lag] += tokens
