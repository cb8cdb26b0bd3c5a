"""How RolloutService moves samples between engines: export, absorb, resubmit, and losses.

Every move goes through the collector first (an exported state carries tokens not polled
yet), so a sample resumes from exactly the token where it stopped, wherever it goes next.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Sequence, TypeVar

from rlboost.controller.registry import DRAINING, GONE
from rlboost.errors import TransferTimeout
from rlboost.migration.batch import MigrationBatch

T = TypeVar("T")


class EngineMoves:
    """Mixin of RolloutService (it relies on the service's registry, router, step and engines)."""

    async def _guard(self, call: Awaitable[T]) -> T:
        """Bound an engine call by call_timeout_s, so a silent instance cannot stall the loop."""
        limit = self.config.call_timeout_s
        try:
            if hasattr(asyncio, "timeout"):  # runs the call in this task: no extra loop turns
                async with asyncio.timeout(limit / self.clock.speed):
                    return await call
            return await asyncio.wait_for(call, limit / self.clock.speed)
        except asyncio.TimeoutError as exc:
            raise TransferTimeout(f"engine call got no answer within {limit} s") from exc

    def _lose(self, iid: str, reason: str) -> None:
        """The instance is dead: its samples resume from their last collected tokens elsewhere."""
        rec = self.registry.get(iid)
        if rec is None or (rec.state == GONE and iid not in self._engines):
            return
        self.registry.mark_gone(iid, reason)
        self._engines.pop(iid, None)  # a dead engine cannot be closed
        call = self._calls.pop(iid, None)
        if call is not None:
            call[0].cancel()
        sids = self.router.release(iid, failed=True)
        for sid in sids:
            self._kv.pop(sid, None)
        if self._step is not None:
            self._step.meter.deaths += 1
            self._step.meter.resumes += len(sids)
            self._wake()

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
        """Instances whose preemption deadline is near: move their samples out, then let them go."""
        for rec in self.registry.drains_due():
            iid = rec.instance_id
            if self._step is not None and iid in self._engines:
                moved = await self._take_back(iid, self.router.samples_on(iid))
                self.router.requeue(moved, failed=False)
            if rec.state == DRAINING:
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
        st, eng, rec = self._step, self._engines[iid], self.registry.get(iid)
        col = st.collector
        try:
            batch = await self._guard(eng.adapter.export_states(list(sids), with_kv=self.config.migrate_with_kv))
        except Exception as exc:
            self._lose(iid, f"export_states() failed: {exc!r}")
            return []
        wanted, returned, moved = set(sids), set(), []
        for i, state in enumerate(batch.states):
            sid = state.sample_id
            if sid not in wanted or sid in returned:
                continue
            returned.add(sid)
            was = col.tokens
            col.absorb(state, rec.weight_version, self.clock.now())
            if col.tokens > was:
                st.meter.add_tokens(iid, eng.kind, col.tokens - was)
                st.last_progress = self.clock.now()
            if col.finished(sid):
                self._finished(sid)
                continue
            st.meter.moved(len(state.output_ids), 0)
            if batch.kv_layout is not None:
                self._kv[sid] = (batch.kv_layout, batch.kv_tokens[i], batch.kv_data[i])
            self.router.unassign(sid)
            moved.append(sid)
        lost = [s for s in sids if s not in returned and not col.finished(s)]
        if lost and iid in self._engines:
            # engines keep samples that finished since the last poll: that poll delivers them
            try:
                res = await self._guard(eng.adapter.poll())
            except Exception as exc:
                res = exc
            await self._polled(iid, res, len(self.router.samples_on(iid)))
            lost = [s for s in lost if not col.finished(s)]
        if lost:  # the engine no longer had them: resume from what was collected
            self.router.requeue(lost, failed=True)
            st.meter.resumes += len(lost)
        return moved

    async def _send(self, iid: str, sids: Sequence[int]) -> None:
        """Start samples on an instance: KV pages where held, else re-prefill from collected tokens."""
        st, rec, eng = self._step, self.registry.get(iid), self._engines.get(iid)
        if eng is None or rec is None or rec.state == GONE:
            self.router.requeue(sids, failed=False)
            return
        col = st.collector
        for sid in sids:
            self.router.assign(sid, iid)
        plain = [col.state_of(s, rec.weight_version) for s in sids if s not in self._kv]
        by_layout: dict[object, list[int]] = {}
        for s in sids:
            if s in self._kv:
                by_layout.setdefault(self._kv[s][0], []).append(s)
        try:
            if plain:
                await self._guard(eng.adapter.submit(plain))
            for layout, group in by_layout.items():
                await self._guard(eng.adapter.import_states(MigrationBatch(
                    states=tuple(col.state_of(s, rec.weight_version) for s in group), kv_layout=layout,
                    kv_tokens=tuple(self._kv[s][1] for s in group),
                    kv_data=tuple(self._kv[s][2] for s in group))))
        except Exception as exc:
            self._lose(iid, f"submit failed: {exc!r}")
            return
        for s in sids:
            self._kv.pop(s, None)
        st.meter.reprefill_tokens += sum(state.position for state in plain if state.output_ids)
