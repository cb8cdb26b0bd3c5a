"""Fakes for unit tests of the controller's parts (mover, intake, decisions) without a loop:
an engine whose answers the test sets, and an engine table over such engines.

The real registry, router and collector are used (they are pure); only the engines and
the table that bounds calls to them are fakes.
"""

from __future__ import annotations

from typing import Any

from rlboost.controller.clock import ManualClock
from rlboost.controller.collector import Collector
from rlboost.controller.engines import EngineSlot, Loss
from rlboost.controller.estimates import RateModel
from rlboost.controller.metrics import StepMeter
from rlboost.controller.records import InstanceInfo, PromptGroup
from rlboost.controller.registry import Registry, RegistryConfig
from rlboost.controller.router import Router, RouterConfig
from rlboost.controller.step import StepState
from rlboost.errors import PeerLost, RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import EngineLoad


class FakeEngine:
    """An EngineAdapter whose answers the test sets. calls records (method, sample ids) in
    order; exports maps a sample to the state export_states returns for it (samples not in
    it are left out, as if they had just finished); submit refuses (RolloutError) any batch
    holding a sample of refuse; a method named in failing raises PeerLost."""

    def __init__(self, *, weight_version: int = 0):
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.submitted: list[RequestState] = []
        self.exports: dict[int, RequestState] = {}
        self.deltas: list = []
        self.refuse: set[int] = set()
        self.failing: set[str] = set()
        self.weight_version = weight_version

    def _enter(self, method: str, ids=()) -> None:
        self.calls.append((method, tuple(ids)))
        if method in self.failing:
            raise PeerLost(f"fake engine: {method} fails")

    async def submit(self, states):
        self._enter("submit", [s.sample_id for s in states])
        if any(s.sample_id in self.refuse for s in states):
            raise RolloutError("fake engine: refused")
        self.submitted += states

    async def poll(self):
        self._enter("poll")
        deltas, self.deltas = self.deltas, []
        return deltas

    async def abort(self, sample_ids):
        self._enter("abort", sample_ids)

    async def export_states(self, sample_ids, *, with_kv):
        self._enter("export", sample_ids)
        return MigrationBatch(states=tuple(self.exports[s] for s in sample_ids if s in self.exports))

    async def load(self):
        self._enter("load")
        return EngineLoad(running=0, queued=0, queued_tokens=0, decode_tokens_per_s=0.0,
                          weight_version=self.weight_version)

    async def close(self):
        self._enter("close")

    async def handoff_release(self, ticket, sample_ids):
        self._enter("release", sample_ids)


class FakeEngineTable:
    """The EngineTable interface over FakeEngines, with no calls in flight and no timeouts
    (guard() awaits the call as it is). lose() does to the registry and router what a loss
    does, and records it in losses."""

    def __init__(self, registry: Registry, router: Router):
        self.registry, self.router = registry, router
        self.slots: dict[str, EngineSlot] = {}
        self.held: dict[int, tuple[str, Any]] = {}
        self.losses: list[Loss] = []
        self.ahead = None  # no steps ahead (strict on-policy)

    def add(self, instance_id: str, kind: str, engine: FakeEngine, rates: RateModel | None = None) -> None:
        self.slots[instance_id] = EngineSlot(engine, rates or RateModel(30.0, 1000.0), kind, 0.0)

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self.slots

    def held_on(self, instance_id: str) -> int:
        return len(self.router.samples_on(instance_id))

    def get(self, instance_id: str) -> EngineSlot | None:
        return self.slots.get(instance_id)

    def rates(self, instance_id: str) -> RateModel:
        return self.slots[instance_id].rates

    def ids(self) -> list[str]:
        return sorted(self.slots)

    def in_flight(self) -> list[str]:
        return []

    async def answer(self, instance_id: str):
        return None

    async def guard(self, call, limit_s=None):
        return await call

    def hold(self, sample_ids, source, ticket) -> None:
        self.held.update((sid, (source, ticket)) for sid in sample_ids)

    def holds(self, sample_id: int) -> bool:
        return sample_id in self.held

    def take_held(self, sample_id: int):
        return self.held.pop(sample_id, None)

    def take_all_held(self, of=None):
        by_ticket: dict[int, tuple[str, Any, list[int]]] = {}
        for sid, (src, ticket) in list(self.held.items()):
            if of is None or sid in of:
                by_ticket.setdefault(id(ticket), (src, ticket, []))[2].append(sid)
                del self.held[sid]
        return list(by_ticket.values())

    def lose(self, instance_id: str, reason: str) -> Loss | None:
        if instance_id not in self.slots:
            return None
        self.registry.mark_gone(instance_id, reason)
        del self.slots[instance_id]
        loss = Loss(instance_id, reason, self.router.release(instance_id, failed=True))
        self.losses.append(loss)
        return loss

    async def close_engine(self, instance_id: str) -> None:
        self.slots.pop(instance_id, None)


class FakeScene:
    """A running step over fake engines: a real registry, router and collector on a manual
    clock, and a FakeEngineTable. add() registers an instance and makes it active."""

    def __init__(self, groups: list[PromptGroup], *, registry: RegistryConfig | None = None,
                 router: RouterConfig | None = None):
        self.clock = ManualClock()
        self.registry = Registry(registry or RegistryConfig(), self.clock)
        self.router = Router(router or RouterConfig())
        self.table = FakeEngineTable(self.registry, self.router)
        collector = Collector(0, groups, 0, microbatch_min_samples=groups[0].num_samples)
        self.router.begin_step(collector.sample_ids)
        self.step = StepState(collector, StepMeter(step=0, weight_version=0, started_at=0.0))

    def add(self, instance_id: str, kind: str = "preemptible", *, capacity: int = 8,
            max_model_len: int | None = None, rates: RateModel | None = None) -> FakeEngine:
        engine = FakeEngine()
        self.registry.register(InstanceInfo(instance_id=instance_id, kind=kind, capacity=capacity,
                                            max_model_len=max_model_len))
        self.registry.heartbeat(instance_id, 0)
        self.table.add(instance_id, kind, engine, rates)
        return engine

    def state(self, sid: int, tokens: int, finish: str | None = None) -> RequestState:
        """The sample as an engine would export it after `tokens` output tokens."""
        fresh = self.step.collector.state_of(sid, 0)
        return RequestState(sample_id=sid, prompt_ids=fresh.prompt_ids, params=fresh.params, seed=fresh.seed,
                            weight_version=0, output_ids=tuple(range(10, 10 + tokens)),
                            output_logprobs=tuple(-0.5 for _ in range(tokens)), finish_reason=finish)

    def collect(self, sid: int, tokens: int, finish: str | None = None) -> None:
        """The collector holds `tokens` output tokens of the sample (finished with `finish`)."""
        self.step.collector.absorb(self.state(sid, tokens, finish), 0)
