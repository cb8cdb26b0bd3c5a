"""Helpers for the controller tests: a recording engine wrapper, an emulated trainer loop,
and the tokens an uninterrupted run produces."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rlboost.controller.clock import ManualClock, run_virtual
from rlboost.controller.records import InstanceInfo
from rlboost.controller.service import RolloutService
from rlboost.errors import PeerLost
from rlboost.migration.endpoint import HandoffEndpoint
from rlboost.rollout.emulated.engine import KV_LAYOUT, EmulatedEngine, EmulatedEngineConfig

OPEN_ENDPOINTS: list[HandoffEndpoint] = []  # closed after each test (tests/controller/conftest.py)

TOKENS = dict(vocab_size=1000, stop_probability=0.02, eos_token_id=2)


def engine_config(**kw) -> EmulatedEngineConfig:
    """An emulated engine with the token statistics every engine of a test shares."""
    return EmulatedEngineConfig(**{**TOKENS, **kw})


@dataclass(frozen=True)
class Event:
    t: float
    instance: str
    method: str
    ids: tuple[int, ...]
    progress: tuple[int, ...] = ()  # for submit/import: output tokens each sample already had


def _kv_bytes(batch) -> int:
    return sum(d.numel() for d in batch.kv_data) if batch.has_kv else 0


class RecordingEngineForTests:
    """Wraps an EmulatedEngine as an EngineAdapter and records every call in order.

    kill() makes later calls fail like a dead actor; hang() makes them never answer.
    With handoff=True it speaks the handoff protocol through a real HandoffEndpoint (pages
    travel over loopback TCP). kv_bytes counts KV page bytes that crossed this adapter, in
    either direction: what a controller would have carried.
    """

    def __init__(self, name: str, engine: EmulatedEngine, log: list[Event], clock, *, handoff: bool = False):
        self.name, self.engine, self.log, self.clock = name, engine, log, clock
        self.dead = False
        self.hung = False
        self.kv_bytes = 0
        self.endpoint = HandoffEndpoint(engine) if handoff else None
        if self.endpoint is not None:
            OPEN_ENDPOINTS.append(self.endpoint)

    def kill(self) -> None:
        self.dead = True

    def hang(self) -> None:
        self.hung = True

    async def _enter(self, method: str, ids=(), progress=()) -> None:
        if self.dead:
            raise PeerLost(f"{self.name} is dead")
        if self.hung:
            await asyncio.Event().wait()
        self.log.append(Event(self.clock.now(), self.name, method, tuple(ids), tuple(progress)))

    async def submit(self, states):
        await self._enter("submit", [s.sample_id for s in states], [len(s.output_ids) for s in states])
        self.engine.submit(states)

    async def poll(self):
        await self._enter("poll")
        deltas = self.engine.poll(0.0)
        if deltas:
            self.log.append(Event(self.clock.now(), self.name, "deltas", tuple(d.sample_id for d in deltas)))
        return deltas

    async def abort(self, sample_ids):
        await self._enter("abort", sample_ids)
        self.engine.abort(sample_ids)

    async def export_states(self, sample_ids, *, with_kv):
        await self._enter("export", sample_ids or ())
        batch = self.engine.export_states(sample_ids, with_kv=with_kv)
        self.kv_bytes += _kv_bytes(batch)
        return batch

    async def import_states(self, batch):
        await self._enter("import", [s.sample_id for s in batch.states])
        self.kv_bytes += _kv_bytes(batch)
        self.engine.import_states(batch)

    async def handoff_send(self, sample_ids, mode):
        await self._enter("export", sample_ids)
        return self.endpoint.handoff_send(sample_ids, mode)

    async def handoff_receive(self, ticket, sample_ids, timeout_s):
        await self._enter("import", sample_ids)
        self.endpoint.handoff_receive(ticket, sample_ids, timeout_s)

    async def handoff_release(self, ticket, sample_ids):
        await self._enter("release", sample_ids)
        self.endpoint.handoff_release(ticket, sample_ids)

    async def handoff_take_back(self, ticket, sample_ids):
        await self._enter("take_back", sample_ids)
        self.endpoint.handoff_take_back(ticket, sample_ids)

    async def load_weights(self, named_tensors, version):
        await self._enter("load_weights")
        self.engine.load_weights(named_tensors, version)

    async def load(self):
        await self._enter("load")
        return self.engine.load()

    async def close(self):
        await self._enter("close")
        self.engine.close()


def add_instance(svc, clock, log, name, kind="preemptible", *, version=0, capacity=8, handoff=False,
                 max_model_len=None, declare_max_model_len=True, **speeds):
    """Create, load and register an instance; returns its recording adapter. handoff=True
    declares its KV layout, so KV pages of migrating samples move engine to engine."""
    engine = EmulatedEngine(engine_config(max_running=capacity, max_model_len=max_model_len, **speeds),
                            clock=clock)
    if version is not None:
        engine.load_weights({}, version)
    rec = RecordingEngineForTests(name, engine, log, clock, handoff=handoff)
    svc.register(InstanceInfo(instance_id=name, kind=kind, capacity=capacity,
                              max_model_len=max_model_len if declare_max_model_len else None,
                              kv_layout=KV_LAYOUT if handoff else None), rec)
    return rec


async def run_step(svc, clock, step, groups, version, *, train_s_per_token=0.0, wait_s=30.0, log=None):
    """The trainer's side of one step; returns (micro-batches, metrics). It lends the reserved
    instances back when the controller needs them (recorded in log as the trainer's
    lend_reserved and took_reserved events)."""
    svc.start_step(step, groups, version)
    while not await svc.wait_window_closed(wait_s):
        pass
    batches = []
    while True:
        mb = await svc.next_microbatch(wait_s)
        if mb is None:
            if svc.reserved_needed():
                if log is not None:
                    log.append(Event(clock.now(), "trainer", "lend_reserved", ()))
                svc.lend_reserved()
                while not await svc.wait_window_closed(wait_s):
                    pass
                if log is not None:
                    log.append(Event(clock.now(), "trainer", "took_reserved", ()))
            continue
        batches.append(mb)
        await clock.asleep(train_s_per_token * mb.num_tokens)
        if mb.last:
            break
    return batches, await svc.end_step()


def uninterrupted(groups, version=0, **token_config):
    """sample id -> (output ids, logprobs, finish reason) from one engine that is never disturbed."""
    clock = ManualClock()
    engine = EmulatedEngine(engine_config(max_running=10_000, **token_config), clock=clock)
    engine.load_weights({}, version)
    engine.submit([s for g in groups for s in g.states(version)])
    clock.advance(1e7)
    out = {}
    for d in engine.poll(0.0):
        ids, lps, _ = out.get(d.sample_id, ((), (), None))
        out[d.sample_id] = (ids + d.ids, lps + d.logprobs, d.finish_reason)
    return out


def outputs(batches):
    """sample id -> (output ids, logprobs, finish reason) of delivered micro-batches; asserts each
    sample is delivered exactly once."""
    out = {}
    for mb in batches:
        for g in mb.groups:
            for s in g.samples:
                assert s.sample_id not in out, f"sample {s.sample_id} delivered twice"
                out[s.sample_id] = (s.output_ids, s.output_logprobs, s.finish_reason)
    return out


def run_service(body, config, policy):
    """Runs `await body(svc, clock, log)` against a started RolloutService on virtual time;
    returns (its result, the event log)."""
    log = []

    async def main(clock):
        svc = RolloutService(config, clock=clock, window_policy=policy)
        await svc.start()
        try:
            return await body(svc, clock, log)
        finally:
            await svc.close()
    return run_virtual(main), log
