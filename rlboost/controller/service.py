"""RolloutService: the controller's driver loop over rollout instances.

Each tick it polls every instance's token deltas, feeds the collector, and carries out the
router's and the offload policy's decisions (submit, migrate, close the local window); it
handles joins, preemption notices and deaths. Engines are reached through EngineAdapter, so
the same loop drives in-process engines (tests, emulation) and Ray actors (production).
"""

from __future__ import annotations

import asyncio

from rlboost.controller._parts import EngineSlot
from rlboost.controller.adapters import EngineAdapter
from rlboost.controller.clock import Clock
from rlboost.controller.collector import APPLIED, GAP
from rlboost.controller.config import ControllerConfig
from rlboost.controller.decisions import StepDecisions
from rlboost.controller.estimates import LengthModel, RateModel
from rlboost.controller.moves import EngineMoves
from rlboost.controller.offload import AdaptiveWindow, WindowPolicy
from rlboost.controller.records import InstanceInfo, InstanceStatus, Lease
from rlboost.controller.registry import ACTIVE, DRAINING, GONE, Registry
from rlboost.controller.router import Router
from rlboost.controller.steps import StepApi
from rlboost.errors import RolloutError, TransferTimeout

_EPS_S = 1e-6


class RolloutService(StepApi, StepDecisions, EngineMoves):
    """The rollout controller: instances, steps, and the loop that drives them.

    Lifecycle: `await start()` launches the loop on the running event loop; `await close()`
    stops it. Per step: start_step() -> wait_window_closed() -> next_microbatch() until a
    micro-batch has last=True -> end_step(); lend_reserved() when reserved_needed() (see
    steps.StepApi). Between steps: set_weight_version().
    """

    def __init__(self, config: ControllerConfig | None = None, *, clock: Clock,
                 window_policy: WindowPolicy | None = None):
        self.config = config or ControllerConfig()
        self.clock = clock
        self.registry = Registry(self.config.registry, clock)
        self.router = Router(self.config.router)
        self.lengths = LengthModel()
        self.policy = window_policy if window_policy is not None else AdaptiveWindow()
        self._engines: dict[str, EngineSlot] = {}
        self._leaving: list[tuple[str, str]] = []
        self._calls: dict[str, tuple[asyncio.Future, str, int]] = {}  # one poll or load in flight each
        self._held: dict[int, tuple[str, object]] = {}
        self._background: set[asyncio.Task] = set()
        self._step = None
        self._tick_lock: asyncio.Lock | None = None
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._crashed: BaseException | None = None

    # -- loop --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            raise RolloutError("the controller loop is already running")
        self._changed = asyncio.Event()
        self._tick_lock = asyncio.Lock()
        self._task = asyncio.create_task(self._run(), name="rlboost-controller")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for task, _, _ in self._calls.values():
            task.cancel()
        self._calls.clear()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for iid in list(self._engines):
            await self._close_engine(iid)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # a bad engine or a bug: the step fails loudly, the loop lives on
                if self._step is None:
                    self._crashed = exc  # every later call raises it instead of waiting forever
                    self._wake()
                    raise
                self._fail(exc)
            await self.clock.asleep(self.config.poll_interval_s)

    async def tick(self) -> None:
        """One round: leases, first contact, polls, drains, window, placement, watchdog.
        Runs under the tick lock, which end_step() takes to finish a step between ticks."""
        async with self._tick_lock:
            for iid in self.registry.expire():
                self._lose(iid, "missed heartbeats")
            while self._leaving:
                self._lose(*self._leaving.pop(0))
            await self._exchange()
            await self._drain_due()
            st = self._step
            if st is not None and st.failure is None and not st.ending:
                await self._window(st)
                await self._place(st)
                self._check(st)
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _expired(self, deadline: float) -> bool:
        # a tolerance, so float rounding cannot leave a deadline a few ulps away forever
        return self.clock.now() >= deadline - _EPS_S

    def _check_loop(self) -> None:
        if self._crashed is not None:
            raise RolloutError(f"the controller loop stopped: {self._crashed!r}") from self._crashed
        if self._changed is None:
            raise RolloutError("the controller loop is not running: await start() first")

    async def _wait_change(self, deadline: float) -> None:
        self._check_loop()
        left = deadline - self.clock.now()
        if left > _EPS_S:
            try:
                await asyncio.wait_for(self._changed.wait(), left / self.clock.speed)
            except asyncio.TimeoutError:
                pass  # the caller re-checks its condition and its deadline

    # -- instances ---------------------------------------------------------------------------

    def register(self, info: InstanceInfo, engine: EngineAdapter) -> Lease:
        """Admit an instance (state joining); the loop contacts it and learns its weight version."""
        lease = self.registry.register(info)
        same = [e.rates for e in self._engines.values() if e.kind == info.kind and e.rates.observed]
        if same:
            per_sample = sum(r.per_sample for r in same) / len(same)
            aggregate = sum(r.aggregate for r in same) / len(same)
        else:
            per_sample = self.config.sample_tokens_per_s
            aggregate = (self.config.reserved_tokens_per_s if info.kind == "reserved"
                         else self.config.preemptible_tokens_per_s)
        self._engines[info.instance_id] = EngineSlot(engine, RateModel(per_sample, aggregate), info.kind,
                                                     self.clock.now())
        return lease

    def heartbeat(self, instance_id: str, weight_version: int | None = None) -> Lease:
        return self.registry.heartbeat(instance_id, weight_version)

    def notice(self, instance_id: str, grace_s: float) -> float:
        """A preemption notice; returns the deadline (controller clock) by which samples leave."""
        deadline = self.registry.notice(instance_id, grace_s)
        if self._step is not None:
            self._step.meter.preemptions += 1
        return deadline

    def deregister(self, instance_id: str, reason: str = "deregistered") -> None:
        """The instance is gone now (e.g. its actor died): resume its samples elsewhere."""
        self._leaving.append((instance_id, reason))

    def set_weight_version(self, version: int) -> None:
        if self._step is not None:
            raise RolloutError("end the running step before making a new weight version current")
        self.registry.set_weight_version(version)

    def instances(self) -> tuple[InstanceStatus, ...]:
        out = []
        for rec in self.registry.live():
            eng = self._engines.get(rec.instance_id)
            rate = eng.rates.full_rate(rec.info.capacity) if eng else 0.0
            out.append(InstanceStatus(instance_id=rec.instance_id, kind=rec.kind, state=rec.state,
                                      weight_version=rec.weight_version, tokens_per_s=rate,
                                      samples=len(self.router.samples_on(rec.instance_id))))
        return tuple(out)

    async def _exchange(self) -> None:
        """Ask every instance without a call in flight for news (active and draining ones: their
        deltas; joining and pulling ones: their load, which tells their weight version), then
        handle the answers that have come. A slow instance never holds up the others."""
        for rec in self.registry.live():
            iid = rec.instance_id
            if iid not in self._engines or iid in self._calls:
                continue
            adapter = self._engines[iid].adapter
            if rec.state in (ACTIVE, DRAINING):
                self._calls[iid] = (asyncio.ensure_future(self._guard(adapter.poll())), "poll",
                                    len(self.router.samples_on(iid)))
            else:
                self._calls[iid] = (asyncio.ensure_future(self._guard(adapter.load())), "load", 0)
        await asyncio.sleep(0)  # in-process engines answer within this turn of the loop
        for iid in sorted(self._calls):
            if iid in self._calls and self._calls[iid][0].done():
                await self._settle(iid)

    async def _settle(self, iid: str) -> None:
        """Wait for the instance's call in flight (if any) and handle its answer."""
        if iid not in self._calls:
            return
        task, kind, running = self._calls[iid]
        await asyncio.wait({task})  # unlike `await task`, does not raise when the call failed
        if task.cancelled() or self._calls.get(iid, (None,))[0] is not task:
            return  # handled meanwhile (lost, or settled by another caller)
        res = task.exception() or task.result()
        del self._calls[iid]
        if kind == "poll":
            await self._polled(iid, res, running)
        elif isinstance(res, TransferTimeout):
            pass  # busy (e.g. loading weights): its heartbeats, or their absence, decide
        elif isinstance(res, BaseException):
            self._lose(iid, f"load() failed: {res!r}")
        elif self.registry.get(iid).state != GONE:
            self.registry.heartbeat(iid, res.weight_version)
            self._loaded(self._engines[iid], res)

    def _loaded(self, eng: EngineSlot, load) -> None:
        """An instance answered load(): time before now is not decode time (a weight pull is
        not slowness), and a decode rate it measured itself is a floor for its aggregate."""
        eng.polled_at = self.clock.now()
        if not eng.rates.observed and load.decode_tokens_per_s > eng.rates.aggregate:
            eng.rates.aggregate = float(load.decode_tokens_per_s)

    async def _polled(self, iid: str, res, running: int) -> None:
        """Handle one instance's poll result (deltas or the exception its poll raised)."""
        if isinstance(res, BaseException):
            self._lose(iid, f"poll() failed: {res!r}")
            return
        if self.registry.get(iid).state == GONE:
            return
        self.registry.heartbeat(iid)
        got = await self._take(iid, res)
        eng, now = self._engines.get(iid), self.clock.now()
        if eng is not None:
            eng.rates.observe(got, now - eng.polled_at, running)
            eng.polled_at = now

    async def _take(self, iid: str, deltas) -> int:
        """Feed one instance's deltas to the collector; returns how many new tokens they held."""
        st = self._step
        if st is None or not deltas:
            return 0
        col, eng = st.collector, self._engines[iid]
        start_tokens, gaps = col.tokens, []
        for d in deltas:
            if not col.knows(d.sample_id) or self.router.owner(d.sample_id) != iid:
                continue  # a sample that has left this instance: its tokens come from elsewhere
            was = col.tokens
            res = col.apply(d, self.clock.now())
            if res == GAP:
                gaps.append(d.sample_id)
            elif res == APPLIED:
                st.meter.add_tokens(iid, eng.kind, col.tokens - was)
                st.last_progress = self.clock.now()
                if col.finished(d.sample_id):
                    self._finished(d.sample_id)
        if gaps:  # tokens went missing between engine and collector: resume from what we hold
            try:
                await self._guard(eng.adapter.abort(gaps))
            except Exception as exc:
                self._lose(iid, f"abort() failed: {exc!r}")  # requeues (and charges) them itself
            gaps = [s for s in gaps if self.router.owner(s) == iid]
            self.router.requeue(gaps, failed=True)
            st.meter.resumes += len(gaps)
        return col.tokens - start_tokens

    def _finished(self, sid: int) -> None:
        self.router.finish(sid)
        self.lengths.observe(self._step.collector.progress(sid))

    def _fail(self, exc: BaseException) -> None:
        st = self._step
        if st is not None and st.failure is None:
            st.failure = exc
            self._wake()
