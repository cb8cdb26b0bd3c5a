"""RolloutService: the controller's loop over rollout instances, and its API. Each tick it
gathers the instances' answers (Intake) and runs a StepRound: what StepDecisions return
(close the window, place and steal samples, fail a stuck step), carried out through the
SampleMover. Engines
are EngineAdapters: one loop drives in-process engines (tests, the simulator) and Ray
actors. The trainer's calls are StepLifecycle's; each instance's lifecycle is the
registry's, which the driver follows through next_events() and moves with place(),
notice() and end().
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Callable

from rlboost.controller.adapters import EngineAdapter
from rlboost.controller.ahead import StepsAhead
from rlboost.controller.clock import Clock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.decisions import StepDecisions
from rlboost.controller.engines import EngineTable
from rlboost.controller.episodes import EpisodeDriver
from rlboost.controller.estimates import LengthModel
from rlboost.controller.events import InstanceEvent
from rlboost.controller.intake import Intake
from rlboost.controller.lifecycle import StepLifecycle
from rlboost.controller.metrics import StepMetrics
from rlboost.controller.mover import SampleMover
from rlboost.controller.offload import AdaptiveWindow, WindowPolicy
from rlboost.controller.records import GroupBatch, InstanceInfo, InstanceStatus, Lease, PromptGroup
from rlboost.controller.registry import Registry
from rlboost.controller.round import StepRound
from rlboost.controller.router import Router
from rlboost.controller.step import Outcome
from rlboost.controller.wakeup import ChangeSignal
from rlboost.errors import RolloutError


class RolloutService:
    """The rollout controller: instances, steps, and the loop that drives them.

    Lifecycle: `await start()` launches the loop on the running event loop; `await close()`
    stops it. Per step: start_step() -> wait_window_closed() -> next_microbatch() until a
    micro-batch has last=True -> end_step(); lend_reserved() when reserved_needed() (see
    lifecycle.StepLifecycle). Between steps: set_weight_version(). Bounded staleness:
    start_step(ahead=True) (while a step runs, up to max_staleness steps wait in lanes whose
    prompts take free slots: controller.ahead), set_weight_version() mid-step, join_reserved().
    """

    def __init__(self, config: ControllerConfig | None = None, *, clock: Clock,
                 window_policy: WindowPolicy | None = None):
        self.config = cfg = config or ControllerConfig()
        self.clock = clock
        self.registry = Registry(cfg.registry, clock, max_staleness=cfg.max_staleness)
        self.router = Router(cfg.router)
        self.lengths = LengthModel()
        self.policy = window_policy if window_policy is not None else AdaptiveWindow()
        self.table = EngineTable(cfg, clock, registry=self.registry, router=self.router)
        self.intake = Intake(clock, table=self.table, registry=self.registry, router=self.router)
        self.mover = SampleMover(cfg, clock, table=self.table, registry=self.registry, router=self.router,
                                 intake=self.intake)
        self.decisions = StepDecisions(cfg, clock, table=self.table, registry=self.registry, router=self.router,
                                       lengths=self.lengths, policy=self.policy)
        self.signal = ChangeSignal(clock)
        self.steps = StepLifecycle(cfg, clock, registry=self.registry, router=self.router, table=self.table,
                                   mover=self.mover, decisions=self.decisions, lengths=self.lengths,
                                   policy=self.policy, signal=self.signal)
        self.round = StepRound(clock, decisions=self.decisions, registry=self.registry, router=self.router,
                               table=self.table, mover=self.mover, note=self.steps.note, fail=self.steps.fail,
                               wake=self.signal.wake)
        self.intake.running = lambda: self.steps.current
        if cfg.max_staleness:  # the steps started ahead of the running one, and where their prompts go
            self.table.ahead = self.decisions.ahead = self.steps.ahead = StepsAhead(
                cfg.max_staleness, registry=self.registry, table=self.table, router=cfg.router, lengths=self.lengths,
                poll_interval_s=cfg.poll_interval_s)
        self.episodes: EpisodeDriver | None = None  # multi-turn runs: attach_environments()
        self._task: asyncio.Task | None = None
        self._renew: dict[str, Callable[[Lease], Any]] = {}  # instance -> how its new leases reach it
        self._pushed = self.registry.current_version  # the version the instances were last told of

    # -- the loop ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.start_now()

    def start_now(self) -> None:
        """Launch the loop on the event loop running now."""
        if self._task is not None:
            raise RolloutError("the controller loop is already running")
        self.signal.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rlboost-controller")

    def attach_environments(self, host: Any) -> None:
        """Samples are episodes from the next step on: each turn's end goes to the environment
        host (an EpisodeHost, or its Ray actor), whose answer the next turn reads."""
        self.episodes = EpisodeDriver(self.clock, self.router, host, fail=self.steps.fail, wake=self.signal.wake)
        self.steps.episodes = True

    async def close(self) -> None:
        if self.episodes is not None:
            await self.episodes.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.table.close()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # a bad engine or a bug: the step fails loudly, the loop lives on
                if self.steps.current is None:
                    self.signal.crashed(exc)  # every later call raises it instead of waiting forever
                    raise
                self.steps.fail(exc)
            await self.clock.asleep(self.config.poll_interval_s)

    async def tick(self) -> None:
        """One round: leases, news from instances, drains, window, placement, watchdog.
        Runs under the tick lock, which end_step() takes to finish a step between ticks."""
        async with self.steps.tick_lock:
            self.steps.note(Outcome(lost=self.table.lose_departed()))
            self.intake.ask_all()
            await asyncio.sleep(0)  # in-process engines answer within this turn of the loop
            for iid in self.table.answered():
                self.steps.note(await self.intake.settle(self.steps.current, iid))
            if self.episodes is not None and self.steps.current is not None:
                self.episodes.advance(self.steps.current)
            await self.round.drain_due(self.steps.current)
            if (st := self.steps.current) is not None:
                await self.round.run(st)
            if self.steps.ahead:
                await self.round.place_ahead(self.steps.current, self.steps.ahead)
            self._first_samples()
        self._push_leases()
        self.signal.wake()

    def _first_samples(self) -> None:
        """The first samples the controller holds on each preemptible instance: an event."""
        for rec in self.registry.live():
            if rec.kind == "preemptible" and not rec.served:
                if held := self.table.held_on(rec.instance_id):
                    self.registry.served(rec.instance_id, held)

    def _push_leases(self) -> None:
        """A new version is current: every instance hears it now, not at its next heartbeat."""
        if self._pushed == self.registry.current_version:
            return
        self._pushed = self.registry.current_version
        for rec in self.registry.live():
            if (renew := self._renew.get(rec.instance_id)) is not None:
                renew(self.registry.lease(rec.instance_id))

    # -- instances ---------------------------------------------------------------------------

    def place(self, instance_id: str, kind: str, **details: Any) -> None:
        """The driver placed an instance (billed from now; it registers once started)."""
        self.registry.place(instance_id, kind, **details)

    def register(self, info: InstanceInfo, engine: EngineAdapter,
                 renew: Callable[[Lease], Any] | None = None) -> Lease:
        """Admit an instance (state joining); the loop contacts it and learns its weight
        version. renew: how a lease reaches it between its heartbeats (a new version)."""
        lease = self.registry.register(info)
        if not self.registry.get(info.instance_id).ended:  # a notice may have drained it while it started
            self.table.add(info, engine)
            if renew is not None:
                self._renew[info.instance_id] = renew
        return lease

    def heartbeat(self, instance_id: str, weight_version: int | None = None) -> Lease:
        return self.registry.heartbeat(instance_id, weight_version)

    def notice(self, instance_id: str, grace_s: float, **details: Any) -> float:
        """A preemption notice; returns the deadline (controller clock) by which samples leave."""
        deadline = self.registry.notice(instance_id, grace_s, **details)
        if (st := self.steps.current) is not None:
            st.meter.preemptions += 1
        return deadline

    async def end(self, instance_id: str, event: str, **details: Any) -> None:
        """The driver ended the instance (event gone or death, details its reason and source):
        written off between ticks, so its samples resume elsewhere before the driver kills it."""
        async with self.steps.tick_lock:
            self.steps.note(Outcome(lost=self.table.lose_now(instance_id, str(details.get("reason", event)),
                                                             end=(event, details))))
        self._renew.pop(instance_id, None)

    async def failed(self, instance_id: str, cause: str) -> None:
        """The instance's engine failed to start or to load a version (cause: one line): lost,
        and the driver hears why."""
        async with self.steps.tick_lock:
            self.steps.note(Outcome(lost=self.table.lose_now(instance_id, f"failed: {cause}", cause=cause)))
        self._renew.pop(instance_id, None)

    def deregister(self, instance_id: str, reason: str = "deregistered") -> None:
        """The instance is gone now (e.g. its actor died): resume its samples elsewhere."""
        self.table.leave(instance_id, reason)

    async def next_events(self, after: int, timeout_s: float) -> list[InstanceEvent]:
        """Instance events after seq `after`, as soon as there is one ([] after timeout_s)."""
        return await self.registry.events.after(after, timeout_s)

    async def wait_busy(self, instance_id: str, timeout_s: float) -> bool:
        """Whether the controller holds samples on the instance within timeout_s (answered
        as soon as it does)."""
        deadline = self.clock.now() + timeout_s
        while not self.table.held_on(instance_id):
            if self.signal.expired(deadline):
                return False
            await self.signal.wait(deadline)
        return True

    def set_weight_version(self, version: int) -> None:
        self.steps.set_weight_version(version)
        self._push_leases()

    def instances(self) -> tuple[InstanceStatus, ...]:
        return self.table.statuses()

    # -- the trainer's calls (StepLifecycle) -----------------------------------------------------

    def start_step(self, step: int, groups: Sequence[PromptGroup], weight_version: int,
                   ahead: bool = False) -> float:
        return self.steps.start_step(step, groups, weight_version, ahead=ahead)

    def join_reserved(self) -> float:
        return self.steps.join_reserved()

    async def wait_window_closed(self, timeout_s: float) -> bool:
        return await self.steps.wait_window_closed(timeout_s)

    def reserved_needed(self) -> bool:
        return self.steps.reserved_needed()

    def lend_reserved(self) -> None:
        self.steps.lend_reserved()

    async def next_microbatch(self, timeout_s: float) -> GroupBatch | None:
        return await self.steps.next_microbatch(timeout_s)

    async def end_step(self) -> StepMetrics:
        return await self.steps.end_step()
