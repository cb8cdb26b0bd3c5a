"""RolloutController: the rollout controller as one async Ray actor. It is a RolloutService
(its loop starts with the actor, on the actor's event loop); only what crosses Ray differs:
an instance registers with its actor handle, which becomes a RayEngineHandle, and the
driver's fire-and-forget calls (place, notice, end) never raise for an instance that has
already ended.
"""

from __future__ import annotations

from typing import Any

import ray

from rlboost.controller.adapters import RayEngineHandle
from rlboost.controller.clock import MonotonicClock
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import AdaptiveWindowConfig, ReferenceWindowConfig, make_policy
from rlboost.controller.records import InstanceInfo, Lease
from rlboost.controller.service import RolloutService
from rlboost.errors import RolloutError


class ControllerActor(RolloutService):
    """The controller actor. Call its methods with `.remote()`.

    The driver (cluster/fleet.py), for each instance's lifecycle:
      place(instance_id, kind, details)        placed and billed: state joining, a join event
      notice(instance_id, grace_s, details)    a preemption notice -> deadline (controller clock)
      end(instance_id, event, details)         the driver ended it (gone: reclaimed, shutdown;
                                               death: killed, lost, failed)
      next_events(after, timeout_s)            the events after seq `after` (controller/events.py),
                                               as soon as there is one
      wait_busy(instance_id, timeout_s)        True once the controller holds samples on it
    Rollout instances (each a Ray actor answering engine_call(name, ...), rollout/host.py):
      register(info, actor) -> Lease           join (state "joining"); the controller asks the
          engine its load to learn its weight version and routes to it once that version is
          current. info.kv_layout: KV pages move actor to actor (only tickets and token-only
          states pass through this actor). An actor with a renew(lease) method is sent each
          new lease the moment a version is current; the lease names the version to pull
          and the relays of its peers.
      heartbeat(instance_id, weight_version) -> Lease   every lease.renew_within_s
      failed(instance_id, cause)               its engine failed to start or to load a version
      deregister(instance_id)                  it is gone; its samples resume from their last token
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
    Also: instances() -> tuple[InstanceStatus, ...], close(). The reserved instances belong
    to one side at a time (reserved_needed(), lend_reserved(): see controller/lifecycle.py).
    """

    def __init__(self, config: ControllerConfig | None = None, policy: str | None = None,
                 policy_config: AdaptiveWindowConfig | ReferenceWindowConfig | None = None,
                 clock_speed: float = 1.0):
        config = config or ControllerConfig()
        window = config.window  # policy/policy_config, when given, override it
        super().__init__(config, clock=MonotonicClock(clock_speed),
                         window_policy=make_policy(policy or window.policy,
                                                   policy_config if policy is not None else window.selected))
        self.start_now()  # an async actor is built on its own running event loop

    def register(self, info: InstanceInfo, engine: Any) -> Lease:
        renew = engine.renew.remote if hasattr(engine, "renew") else None
        return super().register(info, RayEngineHandle(engine), renew)

    def place(self, instance_id: str, kind: str, details: dict | None = None) -> None:
        super().place(instance_id, kind, **(details or {}))

    def notice(self, instance_id: str, grace_s: float, details: dict | None = None) -> float | None:
        """The deadline, or None when the instance has ended already."""
        try:
            return super().notice(instance_id, grace_s, **(details or {}))
        except RolloutError:
            return None

    async def end(self, instance_id: str, event: str, details: dict | None = None) -> None:
        await super().end(instance_id, event, **(details or {}))


RolloutController = ray.remote(num_cpus=0)(ControllerActor)
