"""AdaptiveWindow: closes the local window, online, at the moment the preemptible instances'
measured rate can finish the expected remaining tokens while the trainer trains, shifted by
a delay learned per instance count from how the trainer fared (it starved: close later; its
micro-batches waited for it: close earlier)."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.controller.offload.window import StepObservation, WindowContext


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
