"""EngineAdapter: the controller's one face of an engine, the RolloutEngine protocol (and the
handoff protocol of rlboost.migration.endpoint) awaited, written once over how a call
travels: InProcessEngine calls an EngineHost in this process (in a worker thread, for
engines whose calls block); RayEngineHandle sends the same call to a rollout instance's
Ray actor (its engine_call) and turns a dead actor into PeerLost. So one driver loop drives
in-process engines (tests, the simulator) and Ray actors.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlboost.errors import PeerLost
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import EngineLoad, RolloutEngine, TokenDelta
from rlboost.rollout.host import EngineHost

if TYPE_CHECKING:
    from rlboost.migration.endpoint import HandoffEndpoint


class EngineAdapter(ABC):
    """The engine and handoff protocols, awaited; poll() never blocks (the driver paces itself).
    The handoff calls are made only on instances whose InstanceInfo declares a kv_layout."""

    @abstractmethod
    async def _invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on the engine, wherever it runs."""

    async def submit(self, states: Sequence[RequestState]) -> None:
        await self._invoke("submit", list(states))

    async def poll(self) -> list[TokenDelta]:
        return await self._invoke("poll", 0.0)

    async def abort(self, sample_ids: Sequence[int]) -> None:
        await self._invoke("abort", list(sample_ids))

    async def export_states(self, sample_ids: Sequence[int] | None, *, with_kv: bool) -> Any:
        ids = None if sample_ids is None else list(sample_ids)
        return await self._invoke("export_states", ids, with_kv=with_kv)

    async def import_states(self, batch: Any) -> None:
        await self._invoke("import_states", batch)

    async def load_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        await self._invoke("load_weights", named_tensors, version)

    async def load(self) -> EngineLoad:
        return await self._invoke("load")

    async def close(self) -> None:
        await self._invoke("close")

    async def handoff_send(self, sample_ids: Sequence[int], mode: str) -> tuple[Any, tuple[RequestState, ...]]:
        return await self._invoke("handoff_send", list(sample_ids), mode)

    async def handoff_receive(self, ticket: Any, sample_ids: Sequence[int], timeout_s: float) -> None:
        await self._invoke("handoff_receive", ticket, list(sample_ids), timeout_s)

    async def handoff_release(self, ticket: Any, sample_ids: Sequence[int]) -> None:
        await self._invoke("handoff_release", ticket, list(sample_ids))

    async def handoff_take_back(self, ticket: Any, sample_ids: Sequence[int]) -> None:
        await self._invoke("handoff_take_back", ticket, list(sample_ids))


class InProcessEngine(EngineAdapter):
    """An engine object in this process (with its handoff ends, when given). threaded=True
    runs each call in a worker thread (for engines that compute inside their calls); keep it
    False on virtual time, where a thread would let real time, not the program, decide what
    happens first. Subclasses may wrap every call through _call()."""

    def __init__(self, engine: RolloutEngine, *, handoff: HandoffEndpoint | None = None, threaded: bool = False):
        self.engine = engine
        self.host = EngineHost(engine, handoff=handoff if handoff is not None else False)
        self.threaded = threaded

    async def _invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self.host.method(method), *args, **kwargs)

    async def _call(self, fn, *args, **kwargs):
        if self.threaded:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)


class RayEngineHandle(EngineAdapter):
    """A Ray actor that answers engine_call(name, ...) (an EngineHost, or a rollout instance):
    only tickets and token-only states cross Ray; KV pages go from actor to actor.

    A dead actor raises PeerLost, which the driver treats as the loss of the instance (its
    samples resume from their last collected tokens); the driver also bounds every call by
    its call_timeout_s, so a silent actor is lost the same way.
    """

    def __init__(self, handle: Any):
        self.handle = handle

    async def _invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray  # only this adapter needs Ray; policy code stays importable without it

        try:
            return await self.handle.engine_call.remote(method, *args, **kwargs)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise PeerLost(f"rollout actor died during {method}: {exc}") from exc
