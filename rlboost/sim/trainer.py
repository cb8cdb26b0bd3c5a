"""The trainer's side of a simulated run: it drives a RolloutService step by step the way a
trainer does, and spends the time training and swapping memory would take (on the
service's clock, so virtual time makes minutes pass in milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from rlboost.controller.clock import Clock
from rlboost.controller.metrics import StepMetrics
from rlboost.controller.records import PromptGroup
from rlboost.controller.service import RolloutService


@dataclass(kw_only=True, slots=True)
class EmulatedTrainerConfig:
    """Training time per generated token, and the cost of swapping rollout for training memory."""

    train_s_per_token: float
    switch_s: float = 0.0
    wait_s: float = 60.0

    def __post_init__(self) -> None:
        if self.train_s_per_token < 0 or self.switch_s < 0:
            raise ValueError("train_s_per_token and switch_s must be >= 0")
        if not self.wait_s > 0:
            raise ValueError(f"wait_s must be > 0, got {self.wait_s}")


async def run_emulated_steps(service: RolloutService, clock: Clock, trainer: EmulatedTrainerConfig,
                             groups_for_step: Callable[[int], Sequence[PromptGroup]], steps: int, *,
                             first_step: int = 0,
                             before_step: Callable[[int], None] | None = None) -> list[StepMetrics]:
    """Drive steps the way a trainer does; returns each step's metrics.

    Weight version v = step number is made current before each step, so preemptible
    instances pull it (taking their pull_s) while the reserved ones roll out. When the
    controller needs the reserved instances back it lends them (switch_s each way).
    """
    out = []
    for step in range(first_step, first_step + steps):
        if before_step is not None:
            before_step(step)
        service.set_weight_version(step)
        service.start_step(step, groups_for_step(step), step)
        while not await service.wait_window_closed(trainer.wait_s):
            pass
        await clock.asleep(trainer.switch_s)
        while True:
            mb = await service.next_microbatch(trainer.wait_s)
            if mb is None:
                if service.reserved_needed():  # the rollout cannot finish without them: lend them
                    await clock.asleep(trainer.switch_s)
                    service.lend_reserved()
                    while not await service.wait_window_closed(trainer.wait_s):
                        pass
                    await clock.asleep(trainer.switch_s)
                continue
            await clock.asleep(trainer.train_s_per_token * mb.num_tokens)
            if mb.last:
                break
        out.append(await service.end_step())
    return out
