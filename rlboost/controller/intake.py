"""Intake: what engines answer. Each tick every instance has one call out: a poll for
active and draining ones (their token deltas go to the collector), a load for joining
and pulling ones (it tells the registry their weight version). A slow instance never holds
up the others. Settling an answer returns what it finished and who was lost.
"""

from __future__ import annotations

from typing import Any, Callable

from rlboost.controller.clock import Clock
from rlboost.controller.collector import APPLIED, GAP
from rlboost.controller.engines import EngineSlot, EngineTable
from rlboost.controller.registry import ACTIVE, DRAINING, Registry
from rlboost.controller.router import Router
from rlboost.controller.step import Outcome, StepState
from rlboost.errors import TransferTimeout
from rlboost.rollout.engine import EngineLoad


class Intake:
    """Asks instances for news and feeds their answers to the running step (if any)."""

    def __init__(self, clock: Clock, *, table: EngineTable, registry: Registry, router: Router):
        self.clock, self.table, self.registry, self.router = clock, table, registry, router
        self.running: Callable[[], StepState | None] = lambda: None  # the running step (the service tells)

    def ask_all(self) -> None:
        """Start a call on every instance without one in flight: active and draining ones are
        polled for deltas, joining and pulling ones are asked for their load (so is an idle
        active one that holds an older version than the current: it is pulling it)."""
        for rec in self.registry.live():
            iid = rec.instance_id
            if iid not in self.table or self.table.busy(iid):
                continue
            held = self.table.held_on(iid)
            # one behind but still allowed (bounded staleness) and idle: ask what it holds now
            behind = rec.weight_version < self.registry.current_version and not held
            if rec.state in (ACTIVE, DRAINING) and not behind:
                self.table.ask(iid, "poll", held)
            else:
                self.table.ask(iid, "load")

    async def settle(self, st: StepState | None, iid: str, out: Outcome | None = None) -> Outcome:
        """Wait for the instance's call in flight (if any) and handle its answer."""
        out = Outcome() if out is None else out
        ans = await self.table.answer(iid)
        if ans is None:
            return out
        res = ans.result
        if ans.kind == "poll":
            await self.take_poll(st, iid, res, ans.running, out)
        elif isinstance(res, TransferTimeout):
            pass  # busy (e.g. loading weights): its heartbeats, or their absence, decide
        elif isinstance(res, BaseException):
            out.add_loss(self.table.lose(iid, f"load() failed: {res!r}"))
        elif not self.registry.get(iid).ended:
            self.registry.heartbeat(iid, res.weight_version)
            self._loaded(self.table.get(iid), res)
        return out

    def _loaded(self, slot: EngineSlot, load: EngineLoad) -> None:
        """An instance answered load(): time before now is not decode time (a weight pull is
        not slowness), and a decode rate it measured itself is a floor for its aggregate."""
        slot.polled_at = self.clock.now()
        if not slot.rates.observed and load.decode_tokens_per_s > slot.rates.aggregate:
            slot.rates.aggregate = float(load.decode_tokens_per_s)

    async def take_poll(self, st: StepState | None, iid: str, res: Any, running: int, out: Outcome) -> None:
        """Handle one instance's poll result (deltas, or the exception its poll raised)."""
        if isinstance(res, BaseException):
            out.add_loss(self.table.lose(iid, f"poll() failed: {res!r}"))
            return
        if self.registry.get(iid).ended:
            return
        self.registry.heartbeat(iid)
        got = await self._take(st, iid, res, out)
        slot, now = self.table.get(iid), self.clock.now()
        if slot is not None:
            slot.rates.observe(got, now - slot.polled_at, running)
            slot.polled_at = now

    async def _take(self, st: StepState | None, iid: str, deltas, out: Outcome) -> int:
        """Feed one instance's deltas to the collector; returns how many new tokens they held."""
        if not deltas:
            return 0
        slot, new, gaps = self.table.get(iid), 0, {}
        for d in deltas:
            found = self._step_of(st, d.sample_id)
            if found is None or found[1].owner(d.sample_id) != iid:
                continue  # a sample that has left this instance: its tokens come from elsewhere
            step, router = found
            col = step.collector
            was = col.tokens
            res = col.apply(d, self.clock.now())
            if res == GAP:
                gaps.setdefault(id(step), (step, router, []))[2].append(d.sample_id)
            elif res == APPLIED:
                new += col.tokens - was
                step.progressed(iid, slot.kind, col.tokens - was, self.clock.now())
                if col.finished(d.sample_id):
                    router.finish(d.sample_id)
                    if step.router is None:  # the running step's (the caller learns its lengths)
                        out.finished.append(d.sample_id)
                elif col.awaiting(d.sample_id):  # an episode's turn ended: its environment answers next
                    router.unassign(d.sample_id)
        if gaps:  # tokens went missing between engine and collector: resume from what we hold
            try:
                await self.table.guard(slot.adapter.abort([s for _, _, sids in gaps.values() for s in sids]))
            except Exception as exc:
                out.add_loss(self.table.lose(iid, f"abort() failed: {exc!r}"))  # requeues (and charges) them
            for step, router, sids in gaps.values():
                sids = [s for s in sids if router.owner(s) == iid]
                router.requeue(sids, failed=True)
                step.meter.resumes += len(sids)
        return new

    def _step_of(self, st: StepState | None, sid: int) -> tuple[StepState, Router] | None:
        """The step in rollout that holds a sample, with its router: the running step's, or
        a step ahead's (bounded staleness)."""
        for step in (st, self.running()):  # st may be a step ahead's, on whose behalf a move asks
            if step is not None and step.collector.knows(sid):
                return step, step.router or self.router
        lane = self.table.ahead.of(sid) if self.table.ahead else None
        return (lane.st, lane.router) if lane is not None else None
