"""SimMover: the controller's Mover over simulated engines, and what the controller's Intake
does for them (finished samples collected, rates measured).

StepRound (controller.round) decides and orders every move, as it does for a real run;
this only carries the moves out on the simulated schedules: a sample leaves an engine with
the tokens it made (counted, never materialized) and starts on another after re-prefilling
them. Its methods are coroutines that never wait, run by controller.round.run_now.

The paper's ablations are the controller's modes (ControllerConfig.seeding and .migration,
which SimSpec's what-ifs set): without seeding, samples taken off the reserved instances at
the window's close restart from their prompt; with migration="recompute", so do samples
taken off a preempted instance, as the live SampleMover does.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from rlboost.controller.ahead import StepsAhead
from rlboost.controller.clock import Clock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.continuation import from_prompt, trim_resumed
from rlboost.controller.decisions import StepDecisions
from rlboost.controller.estimates import LengthModel
from rlboost.controller.registry import DRAINING, GONE, Registry
from rlboost.controller.router import Router
from rlboost.controller.step import Outcome, StepState
from rlboost.sim.nodes import SimNode, SimTable
from rlboost.sim.spec import SimSpec


class SimParts(Protocol):
    """What the mover uses of its SimController: the controller's parts, the running step's
    router, the steps ahead, and which step in rollout holds a sample."""

    spec: SimSpec
    config: ControllerConfig  # spec.controller with the ablations' modes
    clock: Clock
    table: SimTable
    registry: Registry
    router: Router
    st: StepState | None  # the running step
    decisions: StepDecisions
    lengths: LengthModel
    ahead: StepsAhead

    def lane_of(self, sid: int) -> tuple[StepState, Router] | None: ...


class SimMover:
    """Take back, send and retire, on the simulated engines of a SimController."""

    def __init__(self, ctl: SimParts):
        self.ctl = ctl
        self.recompute = ctl.config.migration == "recompute"

    # -- the Mover protocol (controller.round) --------------------------------------------------

    async def evacuate(self, st: StepState, iid: str) -> Outcome:
        """Every sample of the running step off the instance (queued again), then those of the
        steps ahead; or, for a step ahead's state, that step's samples alone."""
        node, cfg = self.ctl.table.nodes.get(iid), self.ctl.config
        preemptible = node is not None and node.kind == "preemptible"
        restart = node is not None and from_prompt(node.kind, seeding=cfg.seeding, migration=cfg.migration)
        lane = self.ctl.ahead.holding(st) if st is not self.ctl.st else None
        if lane is not None:  # a step ahead's samples alone
            return Outcome(moved=self.take_off(st, iid, lane.router.samples_on(iid), router=lane.router,
                                               restart=self.recompute and preemptible))
        rec = self.ctl.registry.get(iid)
        moved = self.take_off(st, iid, self.ctl.router.samples_on(iid), restart=restart,
                              preempted=rec is not None and rec.state == DRAINING)
        for lane in self.ctl.ahead:
            self.take_off(lane.st, iid, lane.router.samples_on(iid), router=lane.router,
                          restart=self.recompute and preemptible)
        return Outcome(moved=moved)

    async def take_back(self, st: StepState, iid: str, sids: Sequence[int]) -> Outcome:
        return Outcome(moved=self.take_off(st, iid, sids, requeue=False))

    async def send(self, st: StepState, iid: str, sids: Sequence[int]) -> Outcome:
        """Start samples of the running step, or of a step ahead (in its lane's router)."""
        lane = self.ctl.ahead.holding(st) if st is not self.ctl.st else None
        self.put_on(st, iid, sids, router=lane.router if lane is not None else None)
        return Outcome()

    async def retire(self, st: StepState | None, iid: str) -> Outcome:
        """The drained instance goes: the steps ahead's samples leave it too."""
        for lane in self.ctl.ahead:
            self.take_off(lane.st, iid, lane.router.samples_on(iid), router=lane.router, restart=self.recompute)
        self.ctl.registry.mark_gone(iid, "drained after a preemption notice")
        self.ctl.decisions.stamp += 1
        self.ctl.table.remove(iid)
        return Outcome()

    # -- collection ------------------------------------------------------------------------------

    def collect(self, node: SimNode, now: float, *, advance: bool = True) -> None:
        """Advance the node's engine to now; collect what finished (in the order a live engine
        reports it: its samples' admission order); measure its rate."""
        ctl, sched = self.ctl, node.schedule
        running = sched.running
        done = sched.advance(now) if advance else ()
        if len(done) > 1:  # in the order the engine admitted them, as a live engine reports them
            order = {sid: i for i, sid in enumerate(node.bases)}
            done = sorted(done, key=lambda sid: order.get(sid, -1))
        for sid in done:
            lane = ctl.lane_of(sid)
            if lane is None:
                sched.drop(sid)
                continue
            st, router = lane
            col = st.collector
            col.finish(sid, now)
            sched.drop(sid)
            router.finish(sid)
            ctl.lengths.observe(col.length(sid))
            st.meter.add_tokens(node.instance_id, node.kind, col.length(sid) - node.bases.pop(sid, 0))
        if advance:
            ctl.table.observe(node, now, running)
        ctl.table.touch(node)

    # -- the moves -------------------------------------------------------------------------------

    def take_off(self, st: StepState, iid: str, sids, *, requeue: bool = True, advance: bool = True,
                 router: Router | None = None, restart: bool = False, lost: bool = False,
                 preempted: bool = False) -> list[int]:
        """Take samples off an instance with their progress; finished ones are collected first;
        returns the unfinished ones (queued again unless told otherwise). Without advance,
        what the engine made since it was last collected is lost; with restart, all of it.
        lost: the instance died (its samples are resumed, not migrated); preempted: it drains
        after a notice (what the samples lose is the preemption's, as when lost)."""
        ctl = self.ctl
        router = router or ctl.router
        node = ctl.table.nodes.get(iid)
        if node is None or not sids:
            return []
        col, now = st.collector, ctl.clock.now()
        if node.schedule.t < now or not advance:
            self.collect(node, now, advance=advance)
        moved: dict[int, int] = {}
        for sid in sids:
            if col.finished(sid) or sid not in node.schedule:
                continue
            moved[sid] = col.lift(sid)
            node.schedule.drop(sid)
            st.meter.add_tokens(iid, node.kind, moved[sid] - node.bases.pop(sid, 0))
        ctl.table.touch(node)
        if lost or preempted:
            st.meter.displace(moved)
        for sid, n in moved.items():
            if not lost:
                st.meter.moved(n, 0)
            router.unassign(sid)
            if restart and n:
                st.meter.discarded(sid, n, n)
                col.lift(sid, 0)
        if requeue:
            router.requeue(list(moved), failed=False)
        return list(moved)

    def put_on(self, st: StepState, iid: str, sids, router: Router | None = None) -> None:
        """Start samples on an instance by re-prefill of their collected tokens (trimmed as the
        continuation says); queued again if it cannot take them."""
        ctl = self.ctl
        router = router or ctl.router
        node, rec = ctl.table.nodes.get(iid), ctl.registry.get(iid)
        if node is None or not node.alive or rec is None or rec.state == GONE:
            router.requeue(sids, failed=False)
            return
        col, sched = st.collector, node.schedule
        if sched.t < ctl.clock.now():
            self.collect(node, ctl.clock.now())
        if ctl.ahead:
            self.make_room(iid, len(sched) + len(sids) - rec.info.capacity, st.meter.step)
        before = {sid: col.progress(sid) for sid in sids}
        trim_resumed(col, sids, ctl.config.continuation)
        for sid in sids:
            if (cut := before[sid] - col.progress(sid)) > 0:
                st.meter.discarded(sid, cut, cut)
            router.assign(sid, iid)
            progress = col.progress(sid)
            position = col.prompt_len(sid) + progress
            prefill = sched.pace.prefill_time(float(max(1, position)), 0.0, 1.0)
            sched.admit(sid, prompt_len=col.prompt_len(sid), base=progress, length=col.length(sid), prefill_s=prefill)
            col.place(sid, sched, node.version)
            node.bases[sid] = progress
            st.meter.reprefill_tokens += position if progress else 0
            st.meter.placed(sid, position if progress else 0)
        ctl.table.touch(node)

    def make_room(self, iid: str, excess: int, step: int) -> None:
        """Free `excess` slots on the instance for samples of `step`, taking the latest later
        step's samples with the fewest tokens off it (they wait at the front of their queue)."""
        for lane in reversed(self.ctl.ahead.items):
            if excess <= 0 or lane.step <= step:
                return
            col = lane.st.collector
            mine = sorted(lane.router.samples_on(iid), key=lambda sid: (col.progress(sid), sid))[:excess]
            if mine:
                excess -= len(self.take_off(lane.st, iid, mine, router=lane.router))
