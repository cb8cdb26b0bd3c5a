"""ControllerConfig: the settings of the rollout controller's driver loop.

It holds the configs of the parts it drives (RegistryConfig, RouterConfig, the offload
window's), so a run's config reaches them whole (`--set controller.router.retry_budget=...`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.controller.continuation import CONTINUATIONS, MIGRATIONS
from rlboost.controller.estimates import RateModel
from rlboost.controller.offload import POLICIES, AdaptiveWindowConfig, ReferenceWindowConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import RouterConfig
from rlboost.validate import require


@dataclass(kw_only=True, slots=True)
class WindowConfig:
    """The offload policy: how long the reserved engines roll out each step."""

    policy: str = "adaptive"
    """adaptive (sized from measured rates) or reference (the published 1/3-gain rule)"""
    adaptive: AdaptiveWindowConfig = field(default_factory=AdaptiveWindowConfig)
    reference: ReferenceWindowConfig = field(default_factory=ReferenceWindowConfig)

    def __post_init__(self) -> None:
        require(self.policy in POLICIES, "policy", f"one of {POLICIES}", self.policy)

    @property
    def selected(self) -> AdaptiveWindowConfig | ReferenceWindowConfig:
        return self.adaptive if self.policy == "adaptive" else self.reference


@dataclass(kw_only=True, slots=True)
class ControllerConfig:
    """Settings of the driver loop; rates are priors used until an instance has been measured.

    idle_timeout_s fails a step when no token arrives for that long while samples are
    pending (an idle timeout: a long but progressing step never times out).
    microbatch_min_samples defaults to the first group's size. With migrate_with_kv,
    instances whose InstanceInfo declares a kv_layout move samples' KV pages engine to
    engine; a target pulls them within handoff_timeout_s.
    """

    poll_interval_s: float = 0.05
    """seconds between the controller's rounds of polls and decisions"""
    idle_timeout_s: float = 120.0
    """a step fails when no token arrives for this long while samples are pending"""
    call_timeout_s: float = 30.0
    """an engine call unanswered for this long loses the instance"""
    handoff_timeout_s: float = 60.0
    """seconds a target has to pull migrated KV pages from their source"""
    microbatch_min_samples: int | None = None
    """samples a micro-batch waits for (None: trainer.microbatch_groups x task.group_size)"""
    microbatch_max_samples: int | None = None
    """most samples in one micro-batch (None: no cap)"""
    migrate_with_kv: bool = False
    """move samples with their KV pages engine to engine where both sides can"""
    continuation: str = "token"
    """where a moved sample resumes: token (its last token) or trim_group (the published reference)"""
    seeding: bool = True
    """samples taken off the reserved instances when the window closes continue elsewhere from
    their tokens (False: from their prompt, the paper's ablation without seeding)"""
    migration: str = "continue"
    """a drained or lost instance's samples: continue (from their tokens, as continuation says)
    or recompute (from their prompt, the paper's baseline for migration)"""
    reserved_tokens_per_s: float = 4000.0
    """prior decode rate of a reserved engine until it is measured"""
    preemptible_tokens_per_s: float = 1000.0
    """prior decode rate of a preemptible instance until it is measured"""
    sample_tokens_per_s: float = 30.0
    """prior decode rate of one sample until it is measured"""
    max_staleness: int = 0
    """versions a trained token may lag the step's (0: strict on-policy, the default)"""
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    window: WindowConfig = field(default_factory=WindowConfig)

    def start_rates(self, kind: str, peers) -> RateModel:
        """The rate model an instance of `kind` starts with: its measured peers', else the priors."""
        aggregate = self.reserved_tokens_per_s if kind == "reserved" else self.preemptible_tokens_per_s
        return RateModel.like(peers, self.sample_tokens_per_s, aggregate)

    def __post_init__(self) -> None:
        for name in ("poll_interval_s", "idle_timeout_s", "call_timeout_s", "handoff_timeout_s", "reserved_tokens_per_s",
                     "preemptible_tokens_per_s", "sample_tokens_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        require(isinstance(self.max_staleness, int) and not isinstance(self.max_staleness, bool)
                and 0 <= self.max_staleness <= 8, "max_staleness", "an integer from 0 to 8", self.max_staleness)
        require(self.continuation in CONTINUATIONS, "continuation", f"one of {CONTINUATIONS}", self.continuation)
        require(self.migration in MIGRATIONS, "migration", f"one of {MIGRATIONS}", self.migration)
        for name in ("microbatch_min_samples", "microbatch_max_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
