"""SimSpec: what the simulator runs, in the same component configs and the same units as an
emulated run (seconds of the run; the modelled cluster's are time_scale times longer), so
one config is simulated and emulated alike and the two can be compared figure by figure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.cost import CostConfig
from rlboost.controller.config import ControllerConfig
from rlboost.controller.continuation import MIGRATIONS
from rlboost.rollout.config import RolloutConfig
from rlboost.trainer.emulated import TrainerTiming
from rlboost.transfer.config import TransferConfig
from rlboost.validate import require

LOOKAHEADS = ("free_slots", "after_rollout")


@dataclass(kw_only=True, slots=True)
class SimSpec:
    """A run to simulate: the component configs of a RunConfig, and the step shape.

    rollout.emulated must name a model (the simulator has only the timing model's rates);
    every engine is one rollout.emulated engine with rollout.capacity samples. Weight pulls
    take payload / transfer.publisher.egress_bytes_per_s, shared among concurrent pullers when
    transfer.relay is off (the trainer pushes to each), one payload time with relays.
    """

    rollout: RolloutConfig
    controller: ControllerConfig
    cluster: ClusterConfig
    cost: CostConfig
    transfer: TransferConfig
    trainer_gpus: int
    microbatch_groups: int
    groups_per_step: int
    group_size: int
    max_new_tokens: int
    prompt_tokens: int
    steps: int
    seed: int = 0
    lookahead: str = "free_slots"
    """with controller.max_staleness >= 1, the controller's schedule of the steps ahead
    (controller.ahead): free_slots (what the controller runs: any free slot takes the next
    steps' prompts once every earlier step's are placed, up to max_staleness steps ahead, the
    reserved instances' too while their window is open) or after_rollout (a peer: one step
    ahead, once the trainer has taken the running step's last micro-batch, on preemptible
    instances); see sim.controller"""
    round_s: float | None = None
    """seconds between the simulated controller's rounds (None: controller.poll_interval_s, as
    the real loop); a coarser grid trades reaction time for speed at hundreds of instances"""
    # what-ifs of the RLBoost paper's ablations (sim.ablations)
    seeding: bool = True
    """False: samples taken off the reserved engines when their window closes restart from their
    prompt (no partial response seeds a preemptible instance: the paper's Fig. 12)"""
    migration: str = "continue"
    """continue (a lost or drained instance's samples resume as controller.continuation says) or
    recompute (from their prompt: the paper's Fig. 14 baseline)"""
    window_memory: bool = True
    """False: the published window rule without its memory of the best window per instance
    count (the paper's Fig. 12; window.policy=reference)"""
    decode_speed: float = 1.0
    """every engine's decode and prefill at this times the timing model's (a sensitivity what-if:
    which rollout speed would close a gap; the trainer keeps its time)"""
    train_speed: float = 1.0
    """the trainer's passes at this times the timing model's speed (a sensitivity what-if, as decode_speed)"""
    preempt: tuple[tuple[int, float, int, float | None], ...] = ()
    """(step, modelled seconds into it, instances, seconds until replaced or None): that many
    preemptible instances killed together without notice (the paper's Figs. 12 and 14)"""

    def __post_init__(self) -> None:
        emu = self.rollout.emulated
        require(bool(emu.model), "rollout.emulated.model", "a model of rlboost.timing (the simulator needs "
                "the timing model)", emu.model)
        require(self.steps >= 1, "run.steps", ">= 1", self.steps)
        require(self.prompt_tokens >= 1, "prompt_tokens", ">= 1", self.prompt_tokens)
        require(self.trainer_gpus >= 1, "trainer.world_size", ">= 1", self.trainer_gpus)
        require(self.round_s is None or self.round_s > 0, "round_s", "None or > 0", self.round_s)
        require(self.lookahead in LOOKAHEADS, "lookahead", f"one of {LOOKAHEADS}", self.lookahead)
        require(self.migration in MIGRATIONS, "migration", f"one of {MIGRATIONS}", self.migration)
        require(0 < self.decode_speed <= 100, "decode_speed", "in (0, 100]", self.decode_speed)
        require(0 < self.train_speed <= 100, "train_speed", "in (0, 100]", self.train_speed)
        for item in self.preempt:
            require(len(item) == 4 and item[0] >= 1 and item[1] >= 0 and item[2] >= 1
                    and (item[3] is None or item[3] >= 0), "preempt",
                    "(step >= 1, seconds >= 0, instances >= 1, seconds >= 0 or None) entries", item)
        TrainerTiming.check_scale(emu, self.cost)

    @classmethod
    def of(cls, config: Any, *, prompt_tokens: int, steps: int | None = None) -> SimSpec:
        """The spec of a RunConfig (its sections, taken whole)."""
        task = config.task
        return cls(rollout=config.rollout, controller=config.controller, cluster=config.cluster, cost=config.cost,
                   transfer=config.transfer, trainer_gpus=config.trainer.world_size,
                   microbatch_groups=config.trainer.microbatch_groups, groups_per_step=task.groups_per_step,
                   group_size=task.group_size, max_new_tokens=task.max_new_tokens, prompt_tokens=prompt_tokens,
                   steps=steps or config.run.steps, seed=config.run.seed)

    def replace(self, **changes: Any) -> SimSpec:
        return dataclasses.replace(self, **changes)

    @property
    def time_scale(self) -> float:
        return self.rollout.emulated.time_scale

    @property
    def token_block(self) -> int:
        return self.rollout.emulated.token_block

    @property
    def microbatch_min_samples(self) -> int:
        return self.controller.microbatch_min_samples or self.microbatch_groups * self.group_size
