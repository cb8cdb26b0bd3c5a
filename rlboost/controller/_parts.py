"""What RolloutService's parts share: the state its mixins (EngineMoves, StepDecisions) read
and write, declared once so each mixin states what it relies on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlboost.controller.adapters import EngineAdapter
    from rlboost.controller.clock import Clock
    from rlboost.controller.decisions import StepState
    from rlboost.controller.estimates import LengthModel, RateModel
    from rlboost.controller.offload import WindowPolicy
    from rlboost.controller.registry import Registry
    from rlboost.controller.router import Router
    from rlboost.controller.config import ControllerConfig


class EngineSlot:
    """One instance's engine as the service drives it: its adapter, measured rates, kind,
    and when its tokens were last counted (the base of its next rate observation)."""

    __slots__ = ("adapter", "rates", "kind", "polled_at")

    def __init__(self, adapter: EngineAdapter, rates: RateModel, kind: str, now: float):
        self.adapter, self.rates, self.kind, self.polled_at = adapter, rates, kind, now


class ServiceParts:
    """Attributes RolloutService sets in __init__ and start() (annotations only). The mixins
    also call each other's methods (EngineMoves: _guard, _lose, _take_back, _send, _release;
    StepDecisions: _context, _place) and the service's own (_settle, _polled, _finished,
    _fail, _wake, _check_loop, _expired, _wait_change)."""

    config: ControllerConfig
    clock: Clock
    registry: Registry
    router: Router
    lengths: LengthModel
    policy: WindowPolicy
    _engines: dict[str, EngineSlot]
    _calls: dict[str, tuple[asyncio.Future, str, int]]  # the one poll or load in flight per instance
    _held: dict[int, tuple[str, Any]]   # sample -> (source instance, handoff ticket holding its KV)
    _background: set[asyncio.Task]      # best-effort calls nobody waits for (aborts of lost engines)
    _step: StepState | None
    _tick_lock: asyncio.Lock            # held by each tick, and by end_step() between ticks

