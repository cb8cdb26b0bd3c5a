"""EmulatedFleet: simulated rollout instances around a real RolloutService, on its clock.

The fleet runs in-process engines (EmulatedEngine unless told otherwise) that join,
heartbeat, pull each new weight version (taking the time a real pull would), and can be
preempted with a notice, killed or slowed on a schedule. With a VirtualClock a step of
minutes runs in milliseconds; benches and property tests use it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from rlboost.controller.adapters import InProcessEngine
from rlboost.controller.clock import Clock
from rlboost.controller.records import InstanceInfo
from rlboost.controller.service import RolloutService
from rlboost.errors import PeerLost, RolloutError
from rlboost.rollout.emulated.engine import EmulatedEngine, EmulatedEngineConfig
from rlboost.rollout.engine import RolloutEngine

EVENT_KINDS = ("join", "notice", "death", "speed")


@dataclass(kw_only=True, slots=True)
class SimInstance:
    """A simulated instance of the fleet: its engine's speeds, capacity and how long a weight
    pull takes.

    capacity defaults to engine.max_running (set it when the fleet builds other engines).
    """

    instance_id: str
    kind: str = "preemptible"
    engine: EmulatedEngineConfig = field(default_factory=EmulatedEngineConfig)
    pull_s: float = 5.0
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.pull_s < 0:
            raise ValueError(f"pull_s must be >= 0, got {self.pull_s}")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"capacity must be >= 1 or None, got {self.capacity}")


@dataclass(frozen=True, kw_only=True, slots=True)
class FleetEvent:
    """Something that happens to the fleet at_s seconds after the schedule starts."""

    at_s: float
    kind: str
    instance_id: str
    spec: SimInstance | None = None  # for join
    grace_s: float = 30.0             # for notice
    factor: float = 1.0               # for speed

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind must be one of {EVENT_KINDS}, got {self.kind!r}")
        if self.kind == "join" and self.spec is None:
            raise ValueError("a join event needs a spec (the SimInstance that joins)")
        if self.at_s < 0:
            raise ValueError(f"at_s must be >= 0, got {self.at_s}")


class _MortalEngine(InProcessEngine):
    """An in-process engine that can die: afterwards every call fails as a lost Ray actor would."""

    def __init__(self, engine: RolloutEngine):
        super().__init__(engine)
        self.dead = False

    async def _call(self, fn, *args, **kwargs):
        if self.dead:
            raise PeerLost("emulated instance was killed")
        return fn(*args, **kwargs)


class EmulatedFleet:
    """Instances registered with a service, each with an agent that heartbeats and pulls.

    make_engine builds an instance's engine (default: an EmulatedEngine on the fleet's
    clock); weights(version) gives what a pull of that version loads (default: nothing,
    which is all an EmulatedEngine needs).
    """

    def __init__(self, service: RolloutService, clock: Clock, *,
                 make_engine: Callable[[SimInstance], RolloutEngine] | None = None,
                 weights: Callable[[int], Mapping[str, Any]] | None = None):
        self.service = service
        self.clock = clock
        self.make_engine = make_engine or (lambda spec: EmulatedEngine(spec.engine, clock=clock))
        self.weights = weights or (lambda version: {})
        self.engines: dict[str, RolloutEngine] = {}
        self._adapters: dict[str, _MortalEngine] = {}
        self._tasks: list[asyncio.Task] = []

    def spawn(self, spec: SimInstance) -> RolloutEngine:
        engine = self.make_engine(spec)
        adapter = _MortalEngine(engine)
        self.engines[spec.instance_id] = engine
        self._adapters[spec.instance_id] = adapter
        # engines speaking the handoff protocol (rlboost.migration.endpoint) declare their KV layout
        layout = getattr(engine, "kv_layout", None) if hasattr(engine, "handoff_send") else None
        info = InstanceInfo(instance_id=spec.instance_id, kind=spec.kind,
                            capacity=spec.capacity or spec.engine.max_running,
                            max_model_len=getattr(engine, "max_model_len", None), kv_layout=layout)
        self.service.register(info, adapter)
        self._tasks.append(asyncio.create_task(self._agent(spec, engine, adapter)))
        return engine

    async def _agent(self, spec: SimInstance, engine: RolloutEngine, adapter: _MortalEngine) -> None:
        interval = self.service.config.registry.heartbeat_interval_s
        loaded = engine.load().weight_version
        while not adapter.dead:
            try:
                lease = self.service.heartbeat(spec.instance_id, loaded)
            except RolloutError:
                return  # the controller let it go (drained or declared dead)
            if lease.weight_version != loaded and lease.state != "draining":
                await self.clock.asleep(spec.pull_s)
                if adapter.dead:
                    return
                try:
                    engine.load_weights(self.weights(lease.weight_version), lease.weight_version)
                    loaded = lease.weight_version
                    continue
                except RolloutError:
                    pass  # still busy or closed: ask again next beat (a gone instance's beat fails)
            await self.clock.asleep(interval)

    def kill(self, instance_id: str) -> None:
        """Sudden death: no notice; every later call to the instance fails."""
        self._adapters[instance_id].dead = True

    def notice(self, instance_id: str, grace_s: float) -> None:
        """A preemption notice; the instance dies for good when the grace period ends."""
        try:
            deadline = self.service.notice(instance_id, grace_s)
        except RolloutError:
            return  # already gone
        self._tasks.append(asyncio.create_task(self._die_at(instance_id, deadline)))

    async def _die_at(self, instance_id: str, deadline: float) -> None:
        await self.clock.asleep(deadline - self.clock.now())
        self.kill(instance_id)

    def apply(self, event: FleetEvent) -> None:
        if event.kind == "join":
            self.spawn(event.spec)
        elif event.kind == "notice":
            self.notice(event.instance_id, event.grace_s)
        elif event.kind == "death":
            self.kill(event.instance_id)
        elif not self._adapters[event.instance_id].dead:
            self.engines[event.instance_id].set_speed(event.factor)

    def schedule(self, events: Sequence[FleetEvent]) -> None:
        """Apply each event at its time (relative to now)."""
        start = self.clock.now()

        async def run() -> None:
            for ev in sorted(events, key=lambda e: e.at_s):
                await self.clock.asleep(start + ev.at_s - self.clock.now())
                self.apply(ev)
        self._tasks.append(asyncio.create_task(run()))

    async def close(self) -> None:
        """Stop the agents and close every engine the fleet built (killed ones included)."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for engine in self.engines.values():
            engine.close()  # closing twice is allowed by the engine contract
