"""One small async face over engines, so one driver loop drives in-process engines and Ray actors.

InProcessEngine calls an engine object directly (or in a worker thread, for engines whose
calls block); RayEngineHandle awaits the same methods on a Ray actor handle and turns a dead actor into
PeerLost.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Protocol, Sequence

from rlboost.errors import PeerLost
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import EngineLoad, RolloutEngine, TokenDelta


class EngineAdapter(Protocol):
    """The RolloutEngine protocol, awaited. poll() never blocks: the driver paces itself."""

    async def submit(self, states: Sequence[RequestState]) -> None: ...
    async def poll(self) -> list[TokenDelta]: ...
    async def abort(self, sample_ids: Sequence[int]) -> None: ...
    async def export_states(self, sample_ids: Sequence[int] | None, *, with_kv: bool) -> Any: ...
    async def import_states(self, batch: Any) -> None: ...
    async def load_weights(self, named_tensors: Mapping[str, Any], version: int) -> None: ...
    async def load(self) -> EngineLoad: ...
    async def close(self) -> None: ...
    # the handoff protocol (rollout.handoff.endpoint.MigratingEngine); only used with instances
    # whose InstanceInfo declares a kv_layout
    async def handoff_send(self, sample_ids: Sequence[int], mode: str) -> tuple[Any, tuple[RequestState, ...]]: ...
    async def handoff_receive(self, ticket: Any, sample_ids: Sequence[int], timeout_s: float) -> None: ...
    async def handoff_release(self, ticket: Any, sample_ids: Sequence[int]) -> None: ...
    async def handoff_take_back(self, ticket: Any, sample_ids: Sequence[int]) -> None: ...


class InProcessEngine:
    """An engine object in this process. threaded=True runs each call in a worker thread
    (for engines that compute inside their calls); keep it False on virtual time, where a
    thread would let real time, not the program, decide what happens first."""

    def __init__(self, engine: RolloutEngine, *, threaded: bool = False):
        self.engine = engine
        self.threaded = threaded

    async def _call(self, fn, *args, **kwargs):
        if self.threaded:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    async def submit(self, states):
        await self._call(self.engine.submit, list(states))

    async def poll(self):
        return await self._call(self.engine.poll, 0.0)

    async def abort(self, sample_ids):
        await self._call(self.engine.abort, list(sample_ids))

    async def export_states(self, sample_ids, *, with_kv):
        ids = None if sample_ids is None else list(sample_ids)
        return await self._call(self.engine.export_states, ids, with_kv=with_kv)

    async def import_states(self, batch):
        await self._call(self.engine.import_states, batch)

    async def load_weights(self, named_tensors, version):
        await self._call(self.engine.load_weights, named_tensors, version)

    async def load(self):
        return await self._call(self.engine.load)

    async def close(self):
        await self._call(self.engine.close)

    async def handoff_send(self, sample_ids, mode):
        return await self._call(self.engine.handoff_send, list(sample_ids), mode)

    async def handoff_receive(self, ticket, sample_ids, timeout_s):
        await self._call(self.engine.handoff_receive, ticket, list(sample_ids), timeout_s)

    async def handoff_release(self, ticket, sample_ids):
        await self._call(self.engine.handoff_release, ticket, list(sample_ids))

    async def handoff_take_back(self, ticket, sample_ids):
        await self._call(self.engine.handoff_take_back, ticket, list(sample_ids))


class RayEngineHandle:
    """A Ray actor handle whose actor exposes the RolloutEngine methods (and, for KV
    migration, the handoff methods of rollout.handoff.endpoint.MigratingEngine: only tickets and
    token-only states cross Ray; the pages go from actor to actor).

    A dead actor raises PeerLost, which the driver treats as the loss of the instance (its
    samples resume from their last collected tokens); the driver also bounds every call by
    its call_timeout_s, so a silent actor is lost the same way.
    """

    def __init__(self, handle: Any):
        self.handle = handle

    async def _call(self, method: str, *args, **kwargs):
        import ray  # only this adapter needs Ray; policy code stays importable without it

        try:
            return await getattr(self.handle, method).remote(*args, **kwargs)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise PeerLost(f"rollout actor died during {method}: {exc}") from exc

    async def submit(self, states):
        await self._call("submit", list(states))

    async def poll(self):
        return await self._call("poll", 0.0)

    async def abort(self, sample_ids):
        await self._call("abort", list(sample_ids))

    async def export_states(self, sample_ids, *, with_kv):
        ids = None if sample_ids is None else list(sample_ids)
        return await self._call("export_states", ids, with_kv=with_kv)

    async def import_states(self, batch):
        await self._call("import_states", batch)

    async def load_weights(self, named_tensors, version):
        await self._call("load_weights", named_tensors, version)

    async def load(self):
        return await self._call("load")

    async def close(self):
        await self._call("close")

    async def handoff_send(self, sample_ids, mode):
        return await self._call("handoff_send", list(sample_ids), mode)

    async def handoff_receive(self, ticket, sample_ids, timeout_s):
        await self._call("handoff_receive", ticket, list(sample_ids), timeout_s)

    async def handoff_release(self, ticket, sample_ids):
        await self._call("handoff_release", ticket, list(sample_ids))

    async def handoff_take_back(self, ticket, sample_ids):
        await self._call("handoff_take_back", ticket, list(sample_ids))
