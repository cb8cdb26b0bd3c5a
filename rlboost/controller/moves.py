"""How RolloutService moves samples between engines: take back, start elsewhere, and losses.

Every move goes through the collector first (an exported state carries tokens not polled
yet), so a sample resumes from exactly the token where it stopped, wherever it goes next.
An engine that refuses samples (RolloutError) is not lost: the offending samples are found
and offered elsewhere. Only a failed call (PeerLost, a timeout, anything else) loses it.
With KV migration, pages go engine to engine (rollout.endpoint): the service only ever
holds handoff tickets and token-only states.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Sequence, TypeVar

from rlboost.controller._parts import ServiceParts
from rlboost.controller.registry import ACTIVE, GONE
from rlboost.errors import RolloutError, TransferTimeout
from rlboost.rollout.engine import EngineLoad

T = TypeVar("T")


class CallTimeout(TransferTimeout):
    """An engine call got no answer within the controller's bound: the instance is lost."""


class EngineMoves(ServiceParts):
    """Mixin of RolloutService: carrying samples to, from and between engines."""

    async def _guard(self, call: Awaitable[T], limit_s: float | None = None) -> T:
        """Bound an engine call (call_timeout_s by default), so a silent instance cannot stall the loop."""
        limit = self.config.call_timeout_s if limit_s is None else limit_s
        try:
            if hasattr(asyncio, "timeout"):  # runs the call in this task: no extra loop turns
                async with asyncio.timeout(limit / self.clock.speed):
                    return await call
            return await asyncio.wait_for(call, limit / self.clock.speed)
        except asyncio.TimeoutError as exc:
            raise CallTimeout(f"engine call got no answer within {limit} s") from exc

    def _lose(self, iid: str, reason: str) -> None:
        """The instance is lost: its samples resume from their last collected tokens elsewhere.
        An engine that may still be alive is asked (best effort) to drop them."""
        rec = self.registry.get(iid)
        if rec is None or (rec.state == GONE and iid not in self._engines):
            return
        self.registry.mark_gone(iid, reason)
        eng = self._engines.pop(iid, None)
        call = self._calls.pop(iid, None)
        if call is not None:
            call[0].cancel()
        sids = self.router.release(iid, failed=True)
        for sid, (src, _) in list(self._held.items()):
            if src == iid:  # its sender is gone with it: these resume by re-prefill
                del self._held[sid]
        if eng is not None and sids:
            self._in_background(eng.adapter.abort(list(sids)))
        if self._step is not None:
            self._step.meter.deaths += 1
            self._step.meter.resumes += len(sids)
            self._wake()

    def _in_background(self, call: Awaitable[Any]) -> None:
        async def quietly() -> None:
            try:
                await self._guard(call)
            except Exception:
                pass  # the instance is already written off; nothing depends on this call
        task = asyncio.ensure_future(quietly())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _alive(self, iid: str, why: BaseException) -> EngineLoad | None:
        """After a failed or refused call: is the engine still there? Its load() answers (and
        tells its real weight version, which the registry learns); None if it was lost."""
        eng = self._engines.get(iid)
        if eng is None:
            return None
        try:
            load = await self._guard(eng.adapter.load())
        except Exception as exc:
            self._lose(iid, f"{why!r}, then load() failed: {exc!r}")
            return None
        if iid in self._engines and self.registry.get(iid).state != GONE:
            self.registry.heartbeat(iid, load.weight_version)
        return load

    async def _close_engine(self, iid: str) -> None:
        await self._settle(iid)
        eng = self._engines.pop(iid, None)
        if eng is None:
            return
        try:
            await self._guard(eng.adapter.close())
        except Exception:
            pass  # it is leaving anyway (drained or shut down); a failed close loses nothing

    async def _drain_due(self) -> None:
        """Instances whose preemption deadline is near: move their samples out, then let them go.
        Samples whose KV pages wait on the draining engine are placed before it closes."""
        for rec in self.registry.drains_due():
            iid = rec.instance_id
            st = self._step
            if st is not None and iid in self._engines:
                moved = await self._take_back(iid, self.router.samples_on(iid))
                self.router.requeue(moved, failed=False)
                if any(s in self._held for s in moved) and st.failure is None and not st.ending:
                    await self._place(st)
            if rec.state != GONE:
                self.registry.mark_gone(iid, "drained after a preemption notice")
                await self._close_engine(iid)

    async def _evacuate(self, iid: str) -> None:
        moved = await self._take_back(iid, self.router.samples_on(iid))
        self.router.requeue(moved, failed=False)

    async def _take_back(self, iid: str, sids: Sequence[int]) -> list[int]:
        """Export samples from a live instance into the collector; return the unfinished ones,
        now unassigned (the caller decides where they go)."""
        if not sids:
            return []
        await self._settle(iid)  # deltas already on their way are handled first
        if iid not in self._engines:
            return []  # it was lost meanwhile; its samples are queued again
        eng, rec = self._engines[iid], self.registry.get(iid)
        ticket = None
        try:
            if self.config.migrate_with_kv and rec.info.kv_layout is not None:
                try:
                    ticket, states = await self._guard(eng.adapter.handoff_send(list(sids), "kv"))
                except RolloutError:
                    ticket = None  # e.g. its sender is full: these move without their pages
            if ticket is None:
                states = (await self._guard(eng.adapter.export_states(list(sids), with_kv=False))).states
        except Exception as exc:
            self._lose(iid, f"export failed: {exc!r}")
            return []
        moved = self._absorb(iid, sids, states)
        if ticket is not None:
            self._held.update((sid, (iid, ticket)) for sid in moved)
            extra = [s for s in ticket.sample_ids if s not in moved]
            if extra:
                await self._release(iid, ticket, extra)
        await self._recover_missing(iid, [s for s in sids if s not in moved])
        return moved

    def _absorb(self, iid: str, sids: Sequence[int], states) -> list[int]:
        st, eng, rec = self._step, self._engines[iid], self.registry.get(iid)
        col, wanted, seen, moved = st.collector, set(sids), set(), []
        for state in states:
            sid = state.sample_id
            if sid not in wanted or sid in seen:
                continue
            seen.add(sid)
            was = col.tokens
            col.absorb(state, rec.weight_version, self.clock.now())
            if col.tokens > was:
                st.meter.add_tokens(iid, eng.kind, col.tokens - was)
                st.last_progress = self.clock.now()
            if col.finished(sid):
                self._finished(sid)
                continue
            st.meter.moved(len(state.output_ids), 0)
            self.router.unassign(sid)
            moved.append(sid)
        return moved

    async def _recover_missing(self, iid: str, missing: Sequence[int]) -> None:
        """Samples an export did not return: normally finished since the last poll, which then
        delivers them; any the engine no longer has resume from what was collected."""
        col = self._step.collector
        lost = [s for s in missing if not col.finished(s)]
        if lost and iid in self._engines:
            try:
                res = await self._guard(self._engines[iid].adapter.poll())
            except Exception as exc:
                res = exc
            await self._polled(iid, res, len(self.router.samples_on(iid)))
        # a lost instance has requeued (and charged) its samples already: charge each once
        lost = [s for s in lost if not col.finished(s) and self.router.owner(s) == iid]
        if lost:
            self.router.requeue(lost, failed=True)
            self._step.meter.resumes += len(lost)

    async def _release(self, src: str, ticket: Any, sids: Sequence[int]) -> None:
        """Tell a source to stop serving samples of a ticket (they arrived, or are given up)."""
        eng = self._engines.get(src)
        if eng is None:
            return
        try:
            await self._guard(eng.adapter.handoff_release(ticket, list(sids)))
        except Exception:
            pass  # a source that cannot answer frees its pages when it goes; nothing waits on them

    async def _send(self, iid: str, sids: Sequence[int]) -> None:
        """Start samples on an instance: with their KV pages where a compatible source holds
        them, else by re-prefill of their collected tokens."""
        rec, eng = self.registry.get(iid), self._engines.get(iid)
        if eng is None or rec is None or rec.state == GONE:
            self.router.requeue(sids, failed=False)
            return
        for sid in sids:
            self.router.assign(sid, iid)
        plain, by_ticket = [], {}
        for sid in sids:
            held = self._held.pop(sid, None)
            if held is not None and self._kv_fits(held[0], rec):
                by_ticket.setdefault((held[0], id(held[1])), (held[0], held[1], []))[2].append(sid)
            else:
                plain.append(sid)
                if held is not None:
                    await self._release(held[0], held[1], [sid])
        for src, ticket, group in by_ticket.values():
            plain += await self._receive(iid, src, ticket, group)
            if iid not in self._engines:
                return  # lost: its samples are queued again
        if plain:
            await self._submit(iid, plain)

    def _kv_fits(self, src: str, target) -> bool:
        source = self.registry.get(src)
        return (src in self._engines and source is not None and source.state != GONE
                and source.info.kv_layout is not None and target.info.kv_layout is not None
                and source.info.kv_layout.compatible_with(target.info.kv_layout))

    async def _receive(self, iid: str, src: str, ticket: Any, group: list[int]) -> list[int]:
        """The target pulls the pages of `group` from the source; returns the samples to start
        there by re-prefill instead (the pull failed but the target is fine)."""
        cfg = self.config
        try:
            await self._guard(self._engines[iid].adapter.handoff_receive(ticket, group, cfg.handoff_timeout_s),
                              cfg.call_timeout_s + cfg.handoff_timeout_s)
        except CallTimeout as exc:
            self._lose(iid, f"handoff_receive() got no answer: {exc!r}")
            return []
        except RolloutError:  # refused: the pages go back to their source, or are given up
            await self._refused_pages(iid, src, ticket, group)
            return []
        except Exception as exc:  # the pull failed, or the target died: ask it
            if await self._alive(iid, exc) is None:
                return []
            await self._release(src, ticket, group)
            return group
        await self._release(src, ticket, group)
        self._step.meter.kv_migrations += len(group)
        return []

    async def _refused_pages(self, iid: str, src: str, ticket: Any, group: list[int]) -> None:
        """A target refused KV pages: resume them on their source when it may keep them."""
        st, rec, eng = self._step, self.registry.get(src), self._engines.get(src)
        room = rec is not None and rec.info.capacity - len(self.router.samples_on(src)) >= len(group)
        may_keep = (eng is not None and room and rec.state == ACTIVE and self.registry.version_ok(rec.weight_version)
                    and (rec.kind != "reserved" or st.window_open))
        if may_keep:
            try:
                await self._guard(eng.adapter.handoff_take_back(ticket, group))
                for sid in group:
                    self.router.assign(sid, src)
                return
            except RolloutError:
                pass  # the source cannot take them either: start them again from their tokens
            except Exception as exc:
                self._lose(src, f"handoff_take_back() failed: {exc!r}")
        await self._release(src, ticket, group)
        self.router.requeue(group, failed=False)

    async def _submit(self, iid: str, sids: Sequence[int]) -> None:
        """Start samples from their collected tokens (re-prefill); a refusal is not a loss."""
        rec, eng, col = self.registry.get(iid), self._engines[iid], self._step.collector
        states = [col.state_of(s, rec.weight_version) for s in sids]
        try:
            await self._guard(eng.adapter.submit(states))
        except RolloutError as exc:
            await self._refused(iid, list(sids), exc)
            return
        except Exception as exc:
            self._lose(iid, f"submit() failed: {exc!r}")
            return
        self._step.meter.reprefill_tokens += sum(s.position for s in states if s.output_ids)

    async def _refused(self, iid: str, sids: list[int], why: RolloutError) -> None:
        """The engine refused a batch (which admits none of it). If the registry's view of it
        was stale (e.g. it has loaded a newer version) the samples are simply queued again;
        otherwise each is tried alone, and those it refuses are never offered to it again
        this step (the step fails, naming them, if no instance will take them)."""
        version = self.registry.get(iid).weight_version
        load = await self._alive(iid, why)
        if load is None:
            return
        if load.weight_version != version or iid not in self._routable_ids():
            self.router.requeue(sids, failed=False)
            return
        if len(sids) == 1:
            self.router.refuse(sids[0], iid, str(why))
            return
        col, eng = self._step.collector, self._engines[iid]
        for sid in sids:
            state = col.state_of(sid, version)
            try:
                await self._guard(eng.adapter.submit([state]))
            except RolloutError as exc:
                self.router.refuse(sid, iid, str(exc))
                continue
            except Exception as exc:
                self._lose(iid, f"submit() failed: {exc!r}")
                return
            if state.output_ids:
                self._step.meter.reprefill_tokens += state.position

    def _routable_ids(self) -> set[str]:
        """Instances that may be given samples now (Registry.takes_work)."""
        return {r.instance_id for r in self.registry.live()
                if r.instance_id in self._engines and self.registry.takes_work(r)}
