"""Offload policy: how long the reserved cluster rolls out each step before it trains.

AdaptiveWindow closes the local window, online, at the moment the preemptible instances'
measured rate can finish the expected remaining tokens while the trainer trains, shifted by
a delay learned per instance count from how the trainer fared (it starved: close later; its
micro-batches waited for it: close earlier). ReferenceWindowRule is the published baseline
(window += (trainer idle - rollout idle) / 3, floor 5 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class WindowContext:
    """What is known during a step when the window is reconsidered."""

    elapsed_s: float             # since the step started
    generated_tokens: int        # tokens of this step collected so far
    remaining_tokens: float      # expected tokens still to come from unfinished samples
    local_tokens_per_s: float    # reserved instances, aggregate when full
    remote_tokens_per_s: float   # routable preemptible instances, aggregate when full
    num_preemptible: int


@dataclass(frozen=True, slots=True)
class StepObservation:
    """What one finished step measured, for the next step's window."""

    window_s: float
    num_preemptible: int
    total_tokens: int
    step_time_s: float
    trainer_idle_s: float        # trainer waiting for micro-batches after the window closed
    rollout_idle_s: float        # from the last sample finishing to the end of the step
    train_busy_s: float          # step time minus window minus trainer idle
    last_microbatch_tokens: int
    # each micro-batch taken after the window: (taken at, ((group ready at, group tokens), ...)),
    # in seconds since the step started
    deliveries: tuple = ()

    @classmethod
    def measured(cls, metrics, meter) -> StepObservation:
        """From a finished step's frozen StepMetrics and the StepMeter that measured it. A step
        started ahead (bounded staleness) counts only what came after the reserved
        instances joined it: its tokens collected before then were made during the previous
        step's training, which is the overlap the next window should not pay for again."""
        return cls(window_s=metrics.window_s, num_preemptible=metrics.num_preemptible,
                   total_tokens=metrics.total_tokens - metrics.early_tokens, step_time_s=metrics.step_time_s,
                   trainer_idle_s=metrics.trainer_idle_s, rollout_idle_s=metrics.rollout_idle_s,
                   train_busy_s=max(0.0, metrics.step_time_s - metrics.window_s - metrics.trainer_idle_s),
                   last_microbatch_tokens=meter.last_microbatch_tokens, deliveries=tuple(meter.deliveries))


class WindowPolicy(Protocol):
    def plan(self, ctx: WindowContext) -> float:
        """The window this step is expected to get (reported in metrics); called once as a step starts."""

    def should_close(self, ctx: WindowContext) -> bool:
        """Close the local window now? (Only asked while a preemptible instance can take the rest.)"""

    def observe(self, obs: StepObservation) -> None:
        """Learn from a finished step."""


def ideal_step_time(total_tokens: float, train_s: float, local_tokens_per_s: float,
                    remote_tokens_per_s: float) -> float:
    """Shortest step the rates allow: the reserved cluster rolls out for w then trains for train_s,
    and local plus remote throughput must cover every token.

    >>> ideal_step_time(1000.0, 5.0, 100.0, 100.0)  # w = (1000 - 100 * 5) / 200
    7.5
    """
    rate = local_tokens_per_s + remote_tokens_per_s
    if rate <= 0:
        return math.inf
    return train_s + max(0.0, (total_tokens - remote_tokens_per_s * train_s) / rate)


@dataclass(kw_only=True, slots=True)
class AdaptiveWindowConfig:
    """initial_window_s is used until one step has measured the training time per token.

    After a step where the trainer starved for more than its idle target (idle_target_s, or
    idle_target_fraction of the step when that is less: a 1 s target would let a 2 s step
    starve half the time), the window grows by up_gain x the excess; after a step where
    every micro-batch was ready before the trainer wanted it, it shrinks by down_gain x the
    least such wait (the slack). The training time per token is a moving average (weight
    train_ema) of each step's measurement, taken within train_jump times the current
    estimate either way: one stalled step (a checkpoint, a busy host) moves it a little, a
    lasting change within a few steps.
    """

    initial_window_s: float = 30.0
    """local window until one step has measured the training time per token, seconds"""
    min_window_s: float = 0.0
    """shortest local window, seconds"""
    max_window_s: float | None = None
    """longest local window, seconds (None: no cap)"""
    idle_target_s: float = 1.0
    """trainer idle time per step the window aims at, seconds"""
    idle_target_fraction: float = 0.05
    """... at most this fraction of the step's time (short steps)"""
    up_gain: float = 0.6
    """share of the trainer's excess idle time the window grows by"""
    down_gain: float = 0.5
    """share of the least micro-batch slack the window shrinks by"""
    train_ema: float = 0.5
    """weight of each step's training-time measurement in the moving average"""
    train_jump: float = 2.0
    """one step moves the training-time estimate at most this factor either way"""

    def __post_init__(self) -> None:
        if self.initial_window_s < 0 or self.min_window_s < 0 or self.idle_target_s < 0:
            raise ValueError("initial_window_s, min_window_s and idle_target_s must be >= 0")
        if self.max_window_s is not None and self.max_window_s < self.min_window_s:
            raise ValueError(f"max_window_s must be >= min_window_s ({self.min_window_s})")
        if not 0 < self.idle_target_fraction <= 1:
            raise ValueError(f"idle_target_fraction must be in (0, 1], got {self.idle_target_fraction}")
        for name in ("up_gain", "down_gain", "train_ema"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if not self.train_jump >= 1:
            raise ValueError(f"train_jump must be >= 1, got {self.train_jump}")


class AdaptiveWindow:
    """Close when the remote side can finish the rest during training, `delay` seconds shifted.

    >>> p = AdaptiveWindow(AdaptiveWindowConfig())
    >>> p.observe(StepObservation(window_s=10, num_preemptible=2, total_tokens=1000, step_time_s=30,
    ...                           trainer_idle_s=0, rollout_idle_s=0, train_busy_s=20, last_microbatch_tokens=0))
    >>> ctx = WindowContext(elapsed_s=5, generated_tokens=600, remaining_tokens=400,
    ...                     local_tokens_per_s=100, remote_tokens_per_s=40, num_preemptible=2)
    >>> p.should_close(ctx)  # 400 / 40 = 10 s of remote work <= 20 s of training
    True

    The rule is evaluated with the rates measured right now, so a change in the number of
    preemptible instances moves the window within the same step. The delay (what rate
    arithmetic misses: groups finish only when their slowest sample does, stragglers) is
    learned in window seconds per instance count; an unseen count starts from the nearest.
    """

    def __init__(self, config: AdaptiveWindowConfig | None = None):
        self.config = config or AdaptiveWindowConfig()
        self.train_s_per_token: float | None = None
        self.delays: dict[int, float] = {}
        self._fluid_at: float | None = None

    def delay(self, num_preemptible: int) -> float:
        if not self.delays:
            return 0.0
        nearest = min(self.delays, key=lambda n: (abs(n - num_preemptible), n))
        return self.delays[nearest]

    def _train_s(self, ctx: WindowContext) -> float:
        return self.train_s_per_token * (ctx.generated_tokens + ctx.remaining_tokens)

    def plan(self, ctx: WindowContext) -> float:
        """The expected window; also starts the step (called once, when it starts)."""
        cfg = self.config
        self._fluid_at = None  # when the rate arithmetic first said "close" this step
        if ctx.remote_tokens_per_s <= 0:  # the reserved instances will have to do everything
            if ctx.local_tokens_per_s > 0:
                return ctx.remaining_tokens / ctx.local_tokens_per_s
            return cfg.initial_window_s
        if self.train_s_per_token is None:
            return cfg.initial_window_s
        w = (ctx.remaining_tokens - ctx.remote_tokens_per_s * self._train_s(ctx)) / (
            ctx.local_tokens_per_s + ctx.remote_tokens_per_s)
        w = max(cfg.min_window_s, max(0.0, w) + self.delay(ctx.num_preemptible))
        return min(w, cfg.max_window_s) if cfg.max_window_s is not None else w

    def should_close(self, ctx: WindowContext) -> bool:
        cfg = self.config
        if ctx.remote_tokens_per_s <= 0 or ctx.elapsed_s < cfg.min_window_s:
            return False
        if cfg.max_window_s is not None and ctx.elapsed_s >= cfg.max_window_s:
            return True
        if self.train_s_per_token is None:
            return ctx.elapsed_s >= cfg.initial_window_s
        delay = self.delay(ctx.num_preemptible)
        # a negative delay looks that far ahead: the work left then, at today's rates
        ahead = max(0.0, -delay) * (ctx.local_tokens_per_s + ctx.remote_tokens_per_s)
        if self._fluid_at is None and (ctx.remaining_tokens - ahead) / ctx.remote_tokens_per_s <= self._train_s(ctx):
            self._fluid_at = ctx.elapsed_s
        return self._fluid_at is not None and ctx.elapsed_s >= self._fluid_at + max(0.0, delay)

    def slack(self, deliveries) -> float:
        """How much earlier the trainer could have been served without waiting: the least
        time between a group being ready and the trainer reaching it (groups in a micro-batch
        are reached one after another, at the measured training time per token)."""
        least = float("inf")
        for taken, groups in deliveries:
            reached = taken
            for ready, tokens in groups:
                least = min(least, reached - ready)
                reached += self.train_s_per_token * tokens
        return max(0.0, least)

    def observe(self, obs: StepObservation) -> None:
        cfg = self.config
        if obs.total_tokens > 0 and obs.train_busy_s > 0:
            rate = obs.train_busy_s / obs.total_tokens
            old = self.train_s_per_token
            if old is not None:
                rate = min(max(rate, old / cfg.train_jump), old * cfg.train_jump)
            self.train_s_per_token = rate if old is None else old + cfg.train_ema * (rate - old)
        if obs.num_preemptible == 0 or self.train_s_per_token is None:
            return  # no local/remote balance to learn from
        n = obs.num_preemptible
        target = min(cfg.idle_target_s, cfg.idle_target_fraction * obs.step_time_s)
        if obs.trainer_idle_s > target:
            step = cfg.up_gain * (obs.trainer_idle_s - target)
        elif obs.deliveries:
            step = -cfg.down_gain * self.slack(obs.deliveries)
        else:
            step = 0.0
        self.delays[n] = self.delay(n) + step


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
        self.optima: dict[int, float] = {n: s * unit for n, s in self.config.seeded_optima}
        self._peak = self.window
        self._last_rate = 0.0
        self._last_count = 0

    def plan(self, ctx: WindowContext) -> float:
        return self.window

    def should_close(self, ctx: WindowContext) -> bool:
        return ctx.remote_tokens_per_s > 0 and ctx.elapsed_s >= self.window

    def _fold(self, count: int, weight: float) -> None:
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


POLICIES = ("adaptive", "reference")


def make_policy(name: str, config: AdaptiveWindowConfig | ReferenceWindowConfig | None = None) -> WindowPolicy:
    """A window policy by name: "adaptive" (default) or "reference" (the published baseline)."""
    if name == "adaptive":
        if config is not None and not isinstance(config, AdaptiveWindowConfig):
            raise ValueError(f"the adaptive policy takes an AdaptiveWindowConfig, got {type(config).__name__}")
        return AdaptiveWindow(config)
    if name == "reference":
        if config is not None and not isinstance(config, ReferenceWindowConfig):
            raise ValueError(f"the reference policy takes a ReferenceWindowConfig, got {type(config).__name__}")
        return ReferenceWindowRule(config)
    raise ValueError(f"policy must be one of {POLICIES}, got {name!r}")
