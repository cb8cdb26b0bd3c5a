"""RolloutController: the rollout controller as one async Ray actor.

A thin shell: every method forwards to a RolloutService running on the actor's event loop,
which reaches rollout instances through their Ray actor handles (RayEngineHandle).
"""

from __future__ import annotations

from typing import Any, Sequence

import ray

from rlboost.controller.adapters import RayEngineHandle
from rlboost.controller.clock import MonotonicClock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.metrics import StepMetrics
from rlboost.controller.offload import AdaptiveWindowConfig, ReferenceWindowConfig, make_policy
from rlboost.controller.records import GroupBatch, InstanceInfo, InstanceStatus, Lease, PromptGroup
from rlboost.controller.service import RolloutService


@ray.remote(num_cpus=0)
class RolloutController:
    """The controller actor. All methods are async; call them with `.remote()`.

    Rollout instances (each a Ray actor exposing the RolloutEngine methods):
      register(info: InstanceInfo, engine: ActorHandle) -> Lease
          Join (state "joining"). The controller calls engine.load() to learn the loaded
          weight version, then routes to it once that version is current. info.max_model_len
          keeps samples that cannot fit away from it; info.kv_layout says the actor is a
          rollout.handoff.endpoint.MigratingEngine, so KV pages move actor to actor (only tickets
          and token-only states pass through this actor, never pages).
      heartbeat(instance_id, weight_version) -> Lease
          Renew the lease every lease.renew_within_s (answered polls renew it too). When
          lease.weight_version differs from what the instance holds it should pull that
          version, load it and report it here.
      notice(instance_id, grace_s) -> float
          A preemption notice (30 s on GCP, 120 s on AWS): no new work; in-flight samples
          are exported and resumed elsewhere before the returned deadline (controller clock).
      deregister(instance_id) -> None
          The instance is gone; its samples resume from their last collected token.
    An engine that refuses samples (RolloutError) is not lost: the samples go elsewhere,
    and the step fails naming any sample that no instance will take.

    Trainer, each step (v = the weight version the step's samples must come from):
      set_weight_version(v)                    after publishing v, before start_step
      start_step(step, groups, v) -> float     planned local window, seconds
      wait_window_closed(timeout_s) -> bool    True once the reserved instances are released
      next_microbatch(timeout_s) -> GroupBatch | None
          complete groups (never split); None if none within timeout_s; the one with
          last=True ends the step; raises StepFailed naming missing samples.
      end_step() -> StepMetrics                also feeds the offload policy; aborts what
                                               still runs and settles every call in flight
    Bounded staleness (controller.max_staleness >= 1), the next step started ahead:
      start_step(step + 1, groups, step + 1, ahead=True)   once step's last batch is taken
      set_weight_version(step + 1)             mid-step, once published
      join_reserved() -> float                 the reserved instances hold it: window opens
    Also: instances() -> tuple[InstanceStatus, ...], close().

    The reserved instances belong to one side at a time (a handshake, never a guess):
      - from start_step until wait_window_closed() returns True, they roll out;
      - once it has returned True they are the trainer's: nothing is routed to them;
      - if queued samples can run nowhere else (every preemptible instance lost, or all
        refusing them), reserved_needed() turns True and a waiting next_microbatch()
        returns None at once. The trainer, when it can spare the reserved GPUs (between
        micro-batches, its state moved off them), calls lend_reserved(): the window
        reopens (StepMetrics.reopened) and it calls wait_window_closed() again before it
        trains on them. A trainer that never lends them gets StepFailed after
        idle_timeout_s, saying so.
    """

    def __init__(self, config: ControllerConfig | None = None, policy: str | None = None,
                 policy_config: AdaptiveWindowConfig | ReferenceWindowConfig | None = None,
                 clock_speed: float = 1.0):
        self._config = config or ControllerConfig()
        window = self._config.window  # policy/policy_config, when given, override it
        self._policy = make_policy(policy or window.policy,
                                   policy_config if policy is not None else window.selected)
        self._clock = MonotonicClock(clock_speed)
        self._svc: RolloutService | None = None

    async def _service(self) -> RolloutService:
        if self._svc is None:  # started lazily: the actor's event loop runs only inside methods
            self._svc = RolloutService(self._config, clock=self._clock, window_policy=self._policy)
            await self._svc.start()
        return self._svc

    async def register(self, info: InstanceInfo, engine: Any) -> Lease:
        return (await self._service()).register(info, RayEngineHandle(engine))

    async def heartbeat(self, instance_id: str, weight_version: int | None = None) -> Lease:
        return (await self._service()).heartbeat(instance_id, weight_version)

    async def notice(self, instance_id: str, grace_s: float) -> float:
        return (await self._service()).notice(instance_id, grace_s)

    async def deregister(self, instance_id: str) -> None:
        (await self._service()).deregister(instance_id)

    async def set_weight_version(self, version: int) -> None:
        (await self._service()).set_weight_version(version)

    async def start_step(self, step: int, groups: Sequence[PromptGroup], weight_version: int,
                         ahead: bool = False) -> float:
        return (await self._service()).start_step(step, groups, weight_version, ahead=ahead)

    async def join_reserved(self) -> float:
        return (await self._service()).join_reserved()

    async def wait_window_closed(self, timeout_s: float) -> bool:
        return await (await self._service()).wait_window_closed(timeout_s)

    async def next_microbatch(self, timeout_s: float) -> GroupBatch | None:
        return await (await self._service()).next_microbatch(timeout_s)

    async def reserved_needed(self) -> bool:
        return (await self._service()).reserved_needed()

    async def lend_reserved(self) -> None:
        (await self._service()).lend_reserved()

    async def end_step(self) -> StepMetrics:
        return await (await self._service()).end_step()

    async def instances(self) -> tuple[InstanceStatus, ...]:
        return (await self._service()).instances()

    async def close(self) -> None:
        if self._svc is not None:
            await self._svc.close()
            self._svc = None
