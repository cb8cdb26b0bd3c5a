"""EngineTable: the engines the controller drives, the one call in flight to each, the KV
pages engines hold for samples that left them, and what losing or closing an engine means.

Every engine call goes through guard(), so an instance that stops answering is lost after
call_timeout_s instead of stalling the loop. Nothing here knows about steps or samples'
tokens: the intake and the mover build on this table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any, Awaitable, Iterator, TypeVar

from rlboost.controller.adapters import EngineAdapter
from rlboost.controller.clock import Clock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.estimates import RateModel
from rlboost.controller.records import InstanceInfo, InstanceStatus
from rlboost.controller.registry import Registry
from rlboost.controller.router import Router
from rlboost.errors import TransferTimeout

T = TypeVar("T")
CALL_KINDS = ("poll", "load")


class CallTimeout(TransferTimeout):
    """An engine call got no answer within the controller's bound: the instance is lost."""


class EngineSlot:
    """One instance's engine as the controller drives it: its adapter, measured rates, kind,
    and when its tokens were last counted (the base of its next rate observation)."""

    __slots__ = ("adapter", "rates", "kind", "polled_at")

    def __init__(self, adapter: EngineAdapter, rates: RateModel, kind: str, now: float):
        self.adapter, self.rates, self.kind, self.polled_at = adapter, rates, kind, now


@dataclass(frozen=True, slots=True)
class Answer:
    """What the call in flight to an instance came back with: a poll's deltas or a load's
    EngineLoad, or the exception it raised. running: samples it held when it was asked."""

    kind: str
    result: Any
    running: int


@dataclass(frozen=True, slots=True)
class Loss:
    """An instance written off, and the samples that went back to the queue with it."""

    instance_id: str
    reason: str
    samples: tuple[int, ...]
    ahead: tuple[tuple[Any, tuple[int, ...]], ...] = ()  # (a step ahead's StepState, its samples that went back)


class EngineTable:
    """The instances' engines, keyed by instance id, and the calls the controller has out to them."""

    def __init__(self, config: ControllerConfig, clock: Clock, *, registry: Registry, router: Router):
        self.config, self.clock, self.registry, self.router = config, clock, registry, router
        self._slots: dict[str, EngineSlot] = {}
        self._calls: dict[str, tuple[asyncio.Future, str, int]] = {}  # one poll or load each
        self._held: dict[int, tuple[str, Any]] = {}  # sample -> (source instance, ticket to its KV pages)
        self._background: set[asyncio.Task] = set()  # best-effort calls nobody waits for
        self._leaving: list[tuple[str, str]] = []  # deregistered since the last lose_departed()
        # bounded staleness: the steps ahead (a controller.ahead.StepsAhead, which imports this
        # module's neighbours: typed loosely here), whose samples count on the engines too
        self.ahead: Sequence[Any] | None = None

    # -- engines -----------------------------------------------------------------------------

    def add(self, info: InstanceInfo, adapter: EngineAdapter) -> EngineSlot:
        """Start an instance's rates from those measured on its kind (or the config's priors)."""
        rates = self.config.start_rates(info.kind, [s.rates for s in self._slots.values() if s.kind == info.kind])
        slot = EngineSlot(adapter, rates, info.kind, self.clock.now())
        self._slots[info.instance_id] = slot
        return slot

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._slots

    def held_on(self, instance_id: str) -> int:
        """Samples of every step in rollout on the instance (the steps ahead's included)."""
        return len(self.router.samples_on(instance_id)) + sum(len(lane.router.samples_on(instance_id))
                                                              for lane in self.ahead or ())

    def get(self, instance_id: str) -> EngineSlot | None:
        return self._slots.get(instance_id)

    def rates(self, instance_id: str) -> RateModel:
        return self._slots[instance_id].rates

    def ids(self) -> list[str]:
        return sorted(self._slots)

    def statuses(self) -> tuple[InstanceStatus, ...]:
        out = []
        for rec in self.registry.live():
            slot = self._slots.get(rec.instance_id)
            rate = slot.rates.full_rate(rec.info.capacity) if slot else 0.0
            out.append(InstanceStatus(instance_id=rec.instance_id, kind=rec.kind, state=rec.state,
                                      weight_version=rec.weight_version, tokens_per_s=rate,
                                      samples=self.held_on(rec.instance_id)))
        return tuple(out)

    # -- the one call in flight per instance -------------------------------------------------

    def ask(self, instance_id: str, kind: str, running: int = 0) -> None:
        """Start a poll or a load on the instance; its answer waits for answer()."""
        if kind not in CALL_KINDS:
            raise ValueError(f"kind must be one of {CALL_KINDS}, got {kind!r}")
        adapter = self._slots[instance_id].adapter
        call = adapter.poll() if kind == "poll" else adapter.load()
        self._calls[instance_id] = (asyncio.ensure_future(self.guard(call)), kind, running)

    def busy(self, instance_id: str) -> bool:
        return instance_id in self._calls

    def in_flight(self) -> list[str]:
        return sorted(self._calls)

    def answered(self) -> Iterator[str]:
        """Instances whose call has come back, in id order; each is checked when the iteration
        reaches it, so a call answered while an earlier answer is handled is seen too."""
        for instance_id in sorted(self._calls):
            if instance_id in self._calls and self._calls[instance_id][0].done():
                yield instance_id

    async def answer(self, instance_id: str) -> Answer | None:
        """Wait for the instance's call in flight and hand over its answer; None if it has no
        call, or the call was handled meanwhile (lost, or answered to another caller)."""
        if instance_id not in self._calls:
            return None
        task, kind, running = self._calls[instance_id]
        await asyncio.wait({task})  # unlike `await task`, does not raise when the call failed
        if task.cancelled() or self._calls.get(instance_id, (None,))[0] is not task:
            return None
        del self._calls[instance_id]
        return Answer(kind, task.exception() or task.result(), running)

    # -- KV pages held on a source engine for samples that left it -----------------------------

    def hold(self, sample_ids: list[int], source: str, ticket: Any) -> None:
        self._held.update((sid, (source, ticket)) for sid in sample_ids)

    def holds(self, sample_id: int) -> bool:
        return sample_id in self._held

    def take_held(self, sample_id: int) -> tuple[str, Any] | None:
        return self._held.pop(sample_id, None)

    def take_all_held(self, of: Container[int] | None = None) -> list[tuple[str, Any, list[int]]]:
        """Every held page (of the samples in `of`, when given: one step's), grouped by ticket
        as (source, ticket, samples); none of them is held after."""
        by_ticket: dict[int, tuple[str, Any, list[int]]] = {}
        for sid, (src, ticket) in list(self._held.items()):
            if of is None or sid in of:
                by_ticket.setdefault(id(ticket), (src, ticket, []))[2].append(sid)
                del self._held[sid]
        return list(by_ticket.values())

    def forget_held(self) -> None:
        self._held.clear()

    # -- bounded calls -----------------------------------------------------------------------

    async def guard(self, call: Awaitable[T], limit_s: float | None = None) -> T:
        """Bound an engine call (call_timeout_s by default), so a silent instance cannot stall the loop."""
        limit = self.config.call_timeout_s if limit_s is None else limit_s
        try:
            if hasattr(asyncio, "timeout"):  # runs the call in this task: no extra loop turns
                async with asyncio.timeout(limit / self.clock.speed):
                    return await call
            return await asyncio.wait_for(call, limit / self.clock.speed)
        except asyncio.TimeoutError as exc:
            raise CallTimeout(f"engine call got no answer within {limit} s") from exc

    def in_background(self, call: Awaitable[Any]) -> None:
        async def quietly() -> None:
            try:
                await self.guard(call)
            except Exception:
                pass  # the instance is already written off; nothing depends on this call
        task = asyncio.ensure_future(quietly())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- loss and closing --------------------------------------------------------------------

    def lose(self, instance_id: str, reason: str, *, cause: str = "",
             end: tuple[str, dict] | None = None) -> Loss | None:
        """The instance is lost: its samples go back to the queue (to resume from their last
        collected tokens elsewhere), pages it held for others are given up, and an engine
        that may still be alive is asked (best effort) to drop its samples. The registry
        records it lost (cause: why its engine failed), or ended as the driver said (end:
        event and details). None if it was lost already."""
        rec = self.registry.get(instance_id)
        if rec is None or (rec.ended and instance_id not in self._slots):
            return None
        slot = self._slots.pop(instance_id, None)
        call = self._calls.pop(instance_id, None)
        if call is not None:
            call[0].cancel()
        sids = self.router.release(instance_id, failed=True)
        ahead = []
        for lane in self.ahead or ():  # the steps ahead's samples resume elsewhere too
            released = lane.router.release(instance_id, failed=True)
            lane.st.meter.resumes += len(released)
            if released:
                ahead.append((lane.st, released))
        if end is not None:
            self.registry.end(instance_id, end[0], samples=len(sids), **end[1])
        else:
            self.registry.mark_lost(instance_id, reason, samples=len(sids), cause=cause)
        for sid, (src, _) in list(self._held.items()):
            if src == instance_id:  # its sender is gone with it: these resume by re-prefill
                del self._held[sid]
        if slot is not None and sids:
            self.in_background(slot.adapter.abort(list(sids)))
        return Loss(instance_id, reason, sids, tuple(ahead))

    def lose_now(self, instance_id: str, reason: str, *, cause: str = "",
                 end: tuple[str, dict] | None = None) -> list[Loss]:
        """lose(), and the registry's record of an instance that holds nothing here (still
        starting, already drained or lost): the driver's end, or its engine's failure."""
        loss = self.lose(instance_id, reason, cause=cause, end=end)
        if loss is None:
            if end is not None:
                self.registry.end(instance_id, end[0], **end[1])
            elif cause:
                self.registry.mark_lost(instance_id, reason, cause=cause)
        return [loss] if loss is not None else []

    def leave(self, instance_id: str, reason: str) -> None:
        """The instance is gone (e.g. its actor died); lose_departed() writes it off."""
        self._leaving.append((instance_id, reason))

    def lose_departed(self) -> list[Loss]:
        """Lose the instances whose leases expired, then those that left, in that order."""
        silent = self.registry.expire(samples_of=self.held_on)
        departed = [(iid, "missed heartbeats") for iid in silent] + self._leaving
        self._leaving = []
        return [loss for iid, reason in departed if (loss := self.lose(iid, reason)) is not None]

    async def close_engine(self, instance_id: str) -> None:
        """Close a leaving instance's engine (drained or shut down). Its call in flight, if
        any, should be settled first (Intake.settle), so no answer is dropped."""
        slot = self._slots.pop(instance_id, None)
        if slot is None:
            return
        try:
            await self.guard(slot.adapter.close())
        except Exception:
            pass  # it is leaving anyway; a failed close loses nothing

    async def close(self) -> None:
        """Cancel every call in flight and close every engine."""
        for task, _, _ in self._calls.values():
            task.cancel()
        self._calls.clear()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for instance_id in list(self._slots):
            await self.close_engine(instance_id)
