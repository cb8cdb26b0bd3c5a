"""SampleMover: carries the running step's samples to, from and between engines.

Every move goes through the collector first (an exported state carries tokens not polled
yet), so a sample resumes from exactly the token where it stopped, wherever it goes next.
An engine that refuses samples (RolloutError) is not lost: the offending samples are found
and offered elsewhere. Only a failed call (PeerLost, a timeout, anything else) loses it.
With KV migration, pages go engine to engine (rlboost.migration.endpoint): the controller only ever
holds handoff tickets and token-only states. Each move returns an Outcome (what it
finished, whom it lost, what it took back); where samples go next is the caller's choice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from rlboost.controller.clock import Clock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.continuation import from_prompt, trim_resumed
from rlboost.controller.engines import CallTimeout, EngineTable
from rlboost.controller.intake import Intake
from rlboost.controller.registry import ACTIVE, DRAINING, InstanceRecord, Registry
from rlboost.controller.router import Router
from rlboost.controller.step import Outcome, StepState
from rlboost.errors import RolloutError
from rlboost.rollout.engine import EngineLoad

if TYPE_CHECKING:
    from rlboost.controller.ahead import StepsAhead


class SampleMover:
    """Take back, send (KV pages or re-prefill), and end-of-step cleanup, over an EngineTable."""

    def __init__(self, config: ControllerConfig, clock: Clock, *, table: EngineTable, registry: Registry,
                 router: Router, intake: Intake):
        self.config, self.clock, self.table = config, clock, table
        self.registry, self.router, self.intake = registry, router, intake

    # -- taking samples back -----------------------------------------------------------------

    async def evacuate(self, st: StepState, iid: str) -> Outcome:
        """Take every sample off a live instance and queue the unfinished ones again (from
        their prompt where config.seeding or config.migration says so: continuation.from_prompt)."""
        slot, cfg, rec = self.table.get(iid), self.config, self.registry.get(iid)
        restart = slot is not None and from_prompt(slot.kind, seeding=cfg.seeding, migration=cfg.migration)
        router = self._router(st)
        out = await self.take_back(st, iid, router.samples_on(iid), with_kv=not restart)
        if rec is not None and rec.state == DRAINING:  # a notice's drain: what follows is the preemption's
            st.meter.displace(out.moved)
        if restart:
            self.restart(st, out.moved)
        router.requeue(out.moved, failed=False)
        if st.router is None:  # the running step's: the steps ahead's samples leave it too
            await self._evacuate_ahead(iid, restart=cfg.migration == "recompute" and slot is not None
                                       and slot.kind == "preemptible")
        return out

    async def _evacuate_ahead(self, iid: str, *, restart: bool) -> None:
        """The steps ahead's samples off the instance, queued again in their lanes (their
        outcomes concern steps the trainer does not wait on yet: the loss of the instance,
        if any, is the table's)."""
        for lane in self.ahead or ():
            sids = lane.router.samples_on(iid)
            if sids and iid in self.table:
                out = await self.take_back(lane.st, iid, sids, with_kv=not restart)
                if restart:
                    self.restart(lane.st, out.moved)
                lane.router.requeue(out.moved, failed=False)

    @staticmethod
    def restart(st: StepState, sids: Sequence[int]) -> None:
        """Unfinished samples start again from their prompt; their tokens are charged as discarded."""
        col = st.collector
        for sid in sids:
            if col.knows(sid) and not col.finished(sid) and not col.awaiting(sid):
                model = col.model_tokens(sid)
                st.meter.discarded(sid, col.trim(sid, 0), model)

    async def make_room(self, iid: str, excess: int) -> None:
        """Free `excess` slots on the instance for the running step's samples, taking the
        latest steps ahead's samples with the fewest tokens off it (queued again in front)."""
        for lane in reversed(list(self.ahead or ())):
            if excess <= 0 or iid not in self.table:
                return
            col = lane.st.collector
            mine = sorted(lane.router.samples_on(iid), key=lambda sid: (col.progress(sid), sid))[:excess]
            if mine:
                out = await self.take_back(lane.st, iid, mine, with_kv=False)
                lane.router.requeue(out.moved, failed=False)
                excess -= len(mine)

    def _router(self, st: StepState | None) -> Router:
        """The router of a step: a step ahead's own, or the running step's."""
        return self.router if st is None or st.router is None else st.router

    @property
    def ahead(self) -> StepsAhead | None:
        """Bounded staleness: the steps ahead (controller.ahead), as the engine table holds them."""
        return self.table.ahead

    async def take_back(self, st: StepState, iid: str, sids: Sequence[int], *, with_kv: bool = True) -> Outcome:
        """Export samples from a live instance into the collector; Outcome.moved holds the
        unfinished ones, now unassigned (the caller decides where they go). with_kv=False:
        their KV pages stay behind (they restart by re-prefill)."""
        out = Outcome()
        if not sids:
            return out
        await self.intake.settle(st, iid, out)  # deltas already on their way are handled first
        slot, rec = self.table.get(iid), self.registry.get(iid)
        if slot is None:
            return out  # it was lost meanwhile; its samples are queued again
        ticket = None
        try:
            if with_kv and self.config.migrate_with_kv and rec.info.kv_layout is not None:
                try:
                    ticket, states = await self.table.guard(slot.adapter.handoff_send(list(sids), "kv"))
                except RolloutError:
                    ticket = None  # e.g. its sender is full: these move without their pages
            if ticket is None:
                states = (await self.table.guard(slot.adapter.export_states(list(sids), with_kv=False))).states
        except Exception as exc:
            out.add_loss(self.table.lose(iid, f"export failed: {exc!r}"))
            return out
        self._absorb(st, iid, sids, states, out)
        if ticket is not None:
            self.table.hold(out.moved, iid, ticket)
            extra = [s for s in ticket.sample_ids if s not in out.moved]
            if extra:
                await self._release(iid, ticket, extra)
        await self._recover_missing(st, iid, [s for s in sids if s not in out.moved], out)
        return out

    def _absorb(self, st: StepState, iid: str, sids: Sequence[int], states, out: Outcome) -> None:
        col, kind, version = st.collector, self.table.get(iid).kind, self.registry.get(iid).weight_version
        router = self._router(st)
        wanted, seen = set(sids), set()
        for state in states:
            sid = state.sample_id
            if sid not in wanted or sid in seen:
                continue
            seen.add(sid)
            was = col.tokens
            col.absorb(state, version, self.clock.now())
            if col.tokens > was:
                st.progressed(iid, kind, col.tokens - was, self.clock.now())
            if col.finished(sid):
                router.finish(sid)
                if st.router is None:
                    out.finished.append(sid)
                continue
            if col.awaiting(sid):  # an episode's turn ended: not moved, its environment answers next
                router.unassign(sid)
                continue
            st.meter.moved(len(state.output_ids), 0)
            router.unassign(sid)
            out.moved.append(sid)

    async def _recover_missing(self, st: StepState, iid: str, missing: Sequence[int], out: Outcome) -> None:
        """Samples an export did not return: normally finished since the last poll, which then
        delivers them; any the engine no longer has resume from what was collected."""
        col, router = st.collector, self._router(st)
        lost = [s for s in missing if not col.finished(s) and not col.awaiting(s)]
        if lost and iid in self.table:
            try:
                res = await self.table.guard(self.table.get(iid).adapter.poll())
            except Exception as exc:
                res = exc
            await self.intake.take_poll(st, iid, res, self.table.held_on(iid), out)
        # a lost instance has requeued (and charged) its samples already: charge each once
        lost = [s for s in lost if not col.finished(s) and not col.awaiting(s) and router.owner(s) == iid]
        if lost:
            router.requeue(lost, failed=True)
            st.meter.resumes += len(lost)

    # -- sending samples to an instance --------------------------------------------------------

    async def send(self, st: StepState, iid: str, sids: Sequence[int]) -> Outcome:
        """Start samples on an instance: with their KV pages where a compatible source holds
        them, else by re-prefill of their collected tokens."""
        out, router = Outcome(), self._router(st)
        rec = self.registry.get(iid)
        if iid not in self.table or rec is None or rec.ended:
            router.requeue(sids, failed=False)
            return out
        if st.router is None and self.ahead:  # the running step's samples come first
            await self.make_room(iid, self.table.held_on(iid) + len(sids) - rec.info.capacity)
            if iid not in self.table:
                router.requeue(sids, failed=False)
                return out
        for sid in sids:
            router.assign(sid, iid)
        plain, by_ticket = [], {}
        for sid in sids:
            held = self.table.take_held(sid)
            if held is not None and self._kv_fits(held[0], rec):
                by_ticket.setdefault((held[0], id(held[1])), (held[0], held[1], []))[2].append(sid)
            else:
                plain.append(sid)
                if held is not None:
                    await self._release(held[0], held[1], [sid])
        for src, ticket, group in by_ticket.values():
            plain += await self._receive(st, iid, src, ticket, group, out)
            if iid not in self.table:
                return out  # lost: its samples are queued again
        if plain:
            await self._submit(st, iid, plain, out)
        return out

    def _kv_fits(self, src: str, target: InstanceRecord) -> bool:
        source = self.registry.get(src)
        return (src in self.table and source is not None and not source.ended
                and source.info.kv_layout is not None and target.info.kv_layout is not None
                and source.info.kv_layout.compatible_with(target.info.kv_layout))

    async def _receive(self, st: StepState, iid: str, src: str, ticket: Any, group: list[int],
                       out: Outcome) -> list[int]:
        """The target pulls the pages of `group` from the source; returns the samples to start
        there by re-prefill instead (the pull failed but the target is fine)."""
        cfg = self.config
        try:
            await self.table.guard(self.table.get(iid).adapter.handoff_receive(ticket, group, cfg.handoff_timeout_s),
                                   cfg.call_timeout_s + cfg.handoff_timeout_s)
        except CallTimeout as exc:
            out.add_loss(self.table.lose(iid, f"handoff_receive() got no answer: {exc!r}"))
            return []
        except RolloutError:  # refused: the pages go back to their source, or are given up
            await self._refused_pages(st, src, ticket, group, out)
            return []
        except Exception as exc:  # the pull failed, or the target died: ask it
            if await self._alive(iid, exc, out) is None:
                return []
            await self._release(src, ticket, group)
            return group
        await self._release(src, ticket, group)
        st.meter.kv_migrations += len(group)
        for sid in group:
            st.meter.placed(sid, 0)
        return []

    async def _refused_pages(self, st: StepState, src: str, ticket: Any, group: list[int], out: Outcome) -> None:
        """A target refused KV pages: resume them on their source when it may keep them."""
        rec, slot, router = self.registry.get(src), self.table.get(src), self._router(st)
        room = rec is not None and rec.info.capacity - self.table.held_on(src) >= len(group)
        may_keep = (slot is not None and room and rec.state == ACTIVE and self.registry.version_ok(rec.weight_version)
                    and (rec.kind != "reserved" or st.window_open))
        if may_keep:
            try:
                await self.table.guard(slot.adapter.handoff_take_back(ticket, group))
                for sid in group:
                    router.assign(sid, src)
                return
            except RolloutError:
                pass  # the source cannot take them either: start them again from their tokens
            except Exception as exc:
                out.add_loss(self.table.lose(src, f"handoff_take_back() failed: {exc!r}"))
        await self._release(src, ticket, group)
        router.requeue(group, failed=False)

    async def _submit(self, st: StepState, iid: str, sids: Sequence[int], out: Outcome) -> None:
        """Start samples from their collected tokens (re-prefill); a refusal is not a loss."""
        rec, slot, col = self.registry.get(iid), self.table.get(iid), st.collector
        if self.config.continuation != "token":
            self._trim(st, sids)
        states = [col.state_of(s, rec.weight_version) for s in sids]
        try:
            await self.table.guard(slot.adapter.submit(states))
        except RolloutError as exc:
            await self._refused(st, iid, list(sids), exc, out)
            return
        except Exception as exc:
            out.add_loss(self.table.lose(iid, f"submit() failed: {exc!r}"))
            return
        for state in states:
            self._prefilled(st, state)

    @staticmethod
    def _prefilled(st: StepState, state) -> None:
        """A sample started by re-prefill of what it holds (nothing to prefill again if it is new)."""
        again = state.position if state.output_ids else 0
        st.meter.reprefill_tokens += again
        st.meter.placed(state.sample_id, again)

    def _trim(self, st: StepState, sids: Sequence[int]) -> None:
        """Cut resumed samples back to where the continuation resumes them (trim_group: their
        group's shortest member, finished ones included), before they are resubmitted."""
        col = st.collector
        before = {s: (col.progress(s), col.model_tokens(s)) for s in sids}
        trim_resumed(col, sids, self.config.continuation)
        for sid, (tokens, model) in before.items():
            if tokens > col.progress(sid):
                st.meter.discarded(sid, tokens - col.progress(sid), model - col.model_tokens(sid))

    async def _refused(self, st: StepState, iid: str, sids: list[int], why: RolloutError, out: Outcome) -> None:
        """The engine refused a batch (which admits none of it). If the registry's view of it
        was stale (e.g. it has loaded a newer version) the samples are simply queued again;
        otherwise each is tried alone, and those it refuses are never offered to it again
        this step (the step fails, naming them, if no instance will take them)."""
        version, router = self.registry.get(iid).weight_version, self._router(st)
        load = await self._alive(iid, why, out)
        if load is None:
            return
        if load.weight_version != version or not self._routable(iid):
            router.requeue(sids, failed=False)
            return
        if len(sids) == 1:
            router.refuse(sids[0], iid, str(why))
            return
        col, slot = st.collector, self.table.get(iid)
        for sid in sids:
            state = col.state_of(sid, version)
            try:
                await self.table.guard(slot.adapter.submit([state]))
            except RolloutError as exc:
                router.refuse(sid, iid, str(exc))
                continue
            except Exception as exc:
                out.add_loss(self.table.lose(iid, f"submit() failed: {exc!r}"))
                return
            self._prefilled(st, state)

    def _routable(self, iid: str) -> bool:
        """Whether the instance may be given samples now (Registry.takes_work)."""
        rec = self.registry.get(iid)
        return iid in self.table and rec is not None and self.registry.takes_work(rec)

    async def _alive(self, iid: str, why: BaseException, out: Outcome) -> EngineLoad | None:
        """After a failed or refused call: is the engine still there? Its load() answers (and
        tells its real weight version, which the registry learns); None if it was lost."""
        slot = self.table.get(iid)
        if slot is None:
            return None
        try:
            load = await self.table.guard(slot.adapter.load())
        except Exception as exc:
            out.add_loss(self.table.lose(iid, f"{why!r}, then load() failed: {exc!r}"))
            return None
        if iid in self.table and not self.registry.get(iid).ended:
            self.registry.heartbeat(iid, load.weight_version)
        return load

    async def _release(self, src: str, ticket: Any, sids: Sequence[int]) -> None:
        """Tell a source to stop serving samples of a ticket (they arrived, or are given up)."""
        slot = self.table.get(src)
        if slot is None:
            return
        try:
            await self.table.guard(slot.adapter.handoff_release(ticket, list(sids)))
        except Exception:
            pass  # a source that cannot answer frees its pages when it goes; nothing waits on them

    # -- the end of a step and of an instance ---------------------------------------------------

    async def quiesce(self, st: StepState) -> Outcome:
        """Leave nothing of the step running: settle every call in flight, abort what still
        runs, release every held page (so nothing of it reaches the next step)."""
        out = Outcome()
        for iid in self.table.in_flight():
            await self.intake.settle(st, iid, out)
        for iid in self.table.ids():
            sids = self.router.samples_on(iid)
            if not sids or iid not in self.table:
                continue
            try:
                await self.table.guard(self.table.get(iid).adapter.abort(list(sids)))
            except Exception as exc:
                out.add_loss(self.table.lose(iid, f"abort() failed: {exc!r}"))
                continue
            for sid in sids:
                self.router.unassign(sid)
        for src, ticket, sids in self.table.take_all_held(st.collector):
            await self._release(src, ticket, sids)
        return out

    async def retire(self, st: StepState | None, iid: str) -> Outcome:
        """Let a drained instance go: mark it gone, handle its last answer, close its engine."""
        if iid in self.table and self.ahead:
            await self._evacuate_ahead(iid, restart=self.config.migration == "recompute")
        self.registry.mark_gone(iid, "drained after a preemption notice")
        out = await self.intake.settle(st, iid)
        await self.table.close_engine(iid)
        return out
