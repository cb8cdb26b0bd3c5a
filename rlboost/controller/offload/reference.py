"""ReferenceWindowRule: the published baseline, a fixed window moved by a third of the
idle-time gap after each step (window += (trainer idle - rollout idle) / 3, floor 5 s),
with the published memory of the best window per instance count."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.controller.offload.window import StepObservation, WindowContext


@dataclass(kw_only=True, slots=True)
class ReferenceWindowConfig:
    """The published rule's constants: 150 s to start, a 5 s floor, whole seconds, gain 1/3,
    and its memory of the best window per instance count (the artifact seeds it with
    windows measured for an 8B model: {1: 190, 2: 160, 3: 105, 4: 70} s; empty: none)."""

    initial_window_s: float = 150.0
    """the published rule's first window, seconds"""
    floor_s: float = 5.0
    """the published rule's shortest window, seconds"""
    whole_seconds: bool = True
    """round idle times to whole seconds, as the published rule does"""
    unit_s: float = 1.0
    """the rule's second in the run's seconds (1/time_scale when a run emulates a cluster time_scale times slower)"""
    seeded_optima: tuple[tuple[int, float], ...] = ()
    """(instance count, window seconds) pairs the rule's per-count memory starts from"""
    memory: bool = True
    """keep the per-count memory (False: a changed count starts from the current window, as
    in the paper's ablation without the scheduler's memory; seeded_optima are then unused)"""

    def __post_init__(self) -> None:
        if self.floor_s < 0 or self.initial_window_s < self.floor_s:
            raise ValueError(f"need 0 <= floor_s <= initial_window_s, got {self.floor_s}, {self.initial_window_s}")
        if not self.unit_s > 0:
            raise ValueError(f"unit_s must be > 0, got {self.unit_s}")
        for pair in self.seeded_optima:
            if len(pair) != 2 or pair[0] < 1 or not pair[1] >= 0:
                raise ValueError(f"seeded_optima entries must be (count >= 1, seconds >= 0), got {pair!r}")
        # pairs read back from config.json arrive as lists
        self.seeded_optima = tuple((int(n), float(s)) for n, s in self.seeded_optima)


# The published rule's EMA weights of a new optimum: when throughput stops growing, and when
# the instance count changes (balance.rs ALPHA and BETA).
_ALPHA, _BETA = 0.8, 0.2


class ReferenceWindowRule:
    """The baseline: a fixed window, moved by a third of the idle-time gap after each step,
    with the published memory of the best window per instance count.

    >>> r = ReferenceWindowRule(ReferenceWindowConfig(initial_window_s=60))
    >>> r.observe(StepObservation(window_s=60, num_preemptible=1, total_tokens=1, step_time_s=100,
    ...                           trainer_idle_s=20, rollout_idle_s=1.5, train_busy_s=20, last_microbatch_tokens=0))
    >>> r.window
    66.0

    It never closes before the window has run out (unless everything is done), and it is
    not updated from steps without preemptible instances, where there is no balance to find.
    The memory: the window at the last throughput gain (peak) is folded into the count's
    optimum when throughput stops growing (weight 0.8) or the count changes (0.2); a count
    with an optimum starts from it.
    """

    def __init__(self, config: ReferenceWindowConfig | None = None):
        self.config = config or ReferenceWindowConfig()
        self.window = float(self.config.initial_window_s)
        unit = self.config.unit_s
        self.optima: dict[int, float] = ({n: s * unit for n, s in self.config.seeded_optima}
                                         if self.config.memory else {})
        self._peak = self.window
        self._last_rate = 0.0
        self._last_count = 0

    def plan(self, ctx: WindowContext) -> float:
        return self.window

    def should_close(self, ctx: WindowContext) -> bool:
        return ctx.remote_tokens_per_s > 0 and ctx.elapsed_s >= self.window

    def _fold(self, count: int, weight: float) -> None:
        if not self.config.memory:
            return
        old = self.optima.get(count)
        self.optima[count] = self._peak if old is None else (1 - weight) * old + weight * self._peak

    def observe(self, obs: StepObservation) -> None:
        if obs.num_preemptible == 0:
            return
        n = obs.num_preemptible
        rate = obs.total_tokens / obs.step_time_s if obs.step_time_s > 0 else 0.0
        if n != self._last_count:
            self._last_rate = 0.0
            self._fold(self._last_count, _BETA)
            self._last_count = n
            if n in self.optima:
                self.window = self._peak = self.optima[n]
                return
        elif rate <= self._last_rate:
            self._fold(n, _ALPHA)
        else:
            self._peak = self.window
        self._last_rate = rate
        self._gap_rule(obs)

    def _gap_rule(self, obs: StepObservation) -> None:
        unit = self.config.unit_s
        trainer, rollout = obs.trainer_idle_s / unit, obs.rollout_idle_s / unit
        if self.config.whole_seconds:
            trainer, rollout = float(int(trainer)), float(int(rollout))
        gap = abs(rollout - trainer)
        step = (gap // 3 if self.config.whole_seconds else gap / 3) * unit
        if trainer < rollout:
            self.window = max(self.config.floor_s, self.window - step)
        else:
            self.window = max(self.config.floor_s, self.window + step)
