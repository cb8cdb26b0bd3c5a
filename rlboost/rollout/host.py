"""EngineHost: one engine and both ends of its handoffs behind one call, engine_call(name,
...), restricted to the RolloutEngine protocol and the handoff protocol. A rollout
instance's Ray actor answers the controller through it, and an in-process adapter calls
the same methods, so every call of the two protocols is named once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlboost.errors import RolloutError
from rlboost.migration.ticket import HANDOFF_METHODS
from rlboost.rollout.engine import ENGINE_METHODS, RolloutEngine
from rlboost.transfer import TransferConfig

if TYPE_CHECKING:
    from rlboost.migration.endpoint import HandoffEndpoint


class EngineHost:
    """An engine (or a zero-argument factory of one: what a Ray actor is given, since engines
    hold threads and locks that do not pickle) and, with handoff=True or an endpoint given,
    the handoff protocol over it.

    As a Ray actor: ray.remote(EngineHost).remote(lambda: EmulatedEngine(config), transfer, handoff=True).
    """

    def __init__(self, engine: RolloutEngine | Callable[[], RolloutEngine], transfer: TransferConfig | None = None,
                 *, handoff: bool | HandoffEndpoint = False):
        self.engine = engine if isinstance(engine, RolloutEngine) else engine()
        self.handoff: HandoffEndpoint | None = None
        if handoff is True:
            # imported here, in the engine's process: it brings torch, which a controller that
            # only drives engines through this module never loads
            from rlboost.migration.endpoint import HandoffEndpoint

            self.handoff = HandoffEndpoint(self.engine, transfer)
        elif handoff is not False:
            self.handoff = handoff

    @property
    def kv_layout(self):
        """The engine's KV layout when it can hand off samples with their pages (else None)."""
        if self.handoff is None or not getattr(self.engine, "exports_kv", True):
            return None
        return getattr(self.engine, "kv_layout", None)

    @property
    def max_model_len(self) -> int | None:
        return getattr(self.engine, "max_model_len", None)

    def method(self, name: str) -> Callable[..., Any]:
        """The bound method a protocol call names (close closes both the engine and its handoff ends)."""
        if name == "close":
            return self.close
        if name in ENGINE_METHODS:
            return getattr(self.engine, name)
        if name in HANDOFF_METHODS:
            if self.handoff is None:
                raise RolloutError(f"{name}: this engine was started without the handoff protocol")
            return getattr(self.handoff, name)
        raise ValueError(f"{name!r} is not a call of the engine or handoff protocol")

    def engine_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.method(name)(*args, **kwargs)

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            if self.handoff is not None:
                self.handoff.close()
