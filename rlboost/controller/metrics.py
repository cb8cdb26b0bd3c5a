"""Per-step metrics of the rollout: window, offload share, migrations, preemptions, idle times.

StepMeter accumulates during a step; end_step() freezes it into a StepMetrics record that
the trainer logs and the offload policy learns from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.controller.records import RECORD_FORMAT_VERSION
from rlboost.validate import check_format_version


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMetrics:
    """What one step's rollout did.

    >>> StepMetrics(step=3, weight_version=3, samples=8, total_tokens=800, planned_window_s=12.0,
    ...             window_s=10.5, offload_share=0.4, tokens_per_instance=(("reserved-0", 480),
    ...             ("spot-1", 320)), migrations=3, migrated_tokens=150, reprefill_tokens=190, resumes=0,
    ...             preemptions=1, deaths=0, num_preemptible=1, trainer_idle_s=1.0, rollout_idle_s=4.0,
    ...             rollout_time_s=20.0, step_time_s=24.0, reopened=0, duplicates=0, gaps=0).offload_share
    0.4

    migrations counts samples moved while their instance was alive (window close, drain,
    work stealing); resumes counts samples restarted from their last collected token after
    an instance was lost. reprefill_tokens are prompt + output tokens targets had to prefill.
    kv_migrations counts moved samples whose KV pages went engine to engine (no re-prefill).
    trimmed_tokens are output tokens a trim_group continuation discarded (to be generated again).
    What preemptions alone cost (window handovers, steals and an episode's next turn excluded):
    preempted_samples counts samples taken off an instance that was preempted (drained after a
    notice, or lost), preempted_reprefill_tokens the prompt + output tokens their next
    placement prefilled again (part of reprefill_tokens), and preempted_regenerated_tokens the
    model-written tokens a preemption discarded (migration="recompute" or trim_group: to be
    generated again).
    early_s and early_tokens: a step started ahead (bounded staleness) rolled out for early_s
    on preemptible instances, and collected early_tokens, before the reserved instances
    joined it; its other times count from when they did.
    """

    step: int
    weight_version: int
    samples: int
    total_tokens: int
    planned_window_s: float
    window_s: float
    offload_share: float
    tokens_per_instance: tuple[tuple[str, int], ...]
    migrations: int
    migrated_tokens: int
    reprefill_tokens: int
    resumes: int
    preemptions: int
    deaths: int
    num_preemptible: int
    trainer_idle_s: float
    rollout_idle_s: float
    rollout_time_s: float
    step_time_s: float
    reopened: int
    duplicates: int
    gaps: int
    kv_migrations: int = 0
    trimmed_tokens: int = 0
    early_s: float = 0.0
    early_tokens: int = 0
    preempted_samples: int = 0
    preempted_reprefill_tokens: int = 0
    preempted_regenerated_tokens: int = 0
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, RECORD_FORMAT_VERSION)


@dataclass(slots=True)
class StepMeter:
    """Mutable tallies of the running step."""

    step: int
    weight_version: int
    started_at: float
    planned_window_s: float = 0.0
    window_closed_at: float | None = None
    rollout_done_at: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    preemptible_tokens: int = 0
    migrations: int = 0
    migrated_tokens: int = 0
    reprefill_tokens: int = 0
    resumes: int = 0
    preemptions: int = 0
    deaths: int = 0
    num_preemptible: int = 0
    trainer_idle_s: float = 0.0
    reopened: int = 0
    kv_migrations: int = 0
    trimmed_tokens: int = 0
    last_microbatch_tokens: int = 0
    early_s: float = 0.0
    early_tokens: int = 0
    preempted_samples: int = 0
    preempted_reprefill_tokens: int = 0
    preempted_regenerated_tokens: int = 0
    displaced: set = field(default_factory=set)  # samples a preemption moved, until their next placement
    # per micro-batch after the window: (taken at, ((group ready at, group tokens), ...)), step-relative
    deliveries: list = field(default_factory=list)

    def add_tokens(self, instance_id: str, kind: str, n: int) -> None:
        self.tokens[instance_id] = self.tokens.get(instance_id, 0) + n
        if kind == "preemptible":
            self.preemptible_tokens += n

    def moved(self, output_tokens: int, reprefill_tokens: int) -> None:
        self.migrations += 1
        self.migrated_tokens += output_tokens
        self.reprefill_tokens += reprefill_tokens

    def displace(self, sample_ids) -> None:
        """The samples left an instance because it was preempted (a notice's drain or a loss)."""
        sids = list(sample_ids)
        self.displaced.update(sids)
        self.preempted_samples += len(sids)

    def placed(self, sample_id: int, reprefill_tokens: int) -> None:
        """The sample starts on an instance again, prefilling reprefill_tokens of what it holds
        (0 with its KV pages): charged to its preemption if one moved it."""
        if sample_id in self.displaced:
            self.displaced.discard(sample_id)
            self.preempted_reprefill_tokens += reprefill_tokens

    def discarded(self, sample_id: int, tokens: int, model_tokens: int) -> None:
        """tokens of the sample's output were cut (model_tokens of them the model's), to be
        generated again: charged to its preemption if one moved it."""
        self.trimmed_tokens += tokens
        if sample_id in self.displaced:
            self.preempted_regenerated_tokens += model_tokens

    def freeze(self, *, now: float, samples: int, total_tokens: int, duplicates: int, gaps: int) -> StepMetrics:
        done = self.rollout_done_at if self.rollout_done_at is not None else now
        closed = self.window_closed_at if self.window_closed_at is not None else done
        return StepMetrics(
            step=self.step, weight_version=self.weight_version, samples=samples, total_tokens=total_tokens,
            planned_window_s=self.planned_window_s, window_s=closed - self.started_at,
            offload_share=self.preemptible_tokens / total_tokens if total_tokens else 0.0,
            tokens_per_instance=tuple(sorted(self.tokens.items())), migrations=self.migrations,
            migrated_tokens=self.migrated_tokens, reprefill_tokens=self.reprefill_tokens,
            resumes=self.resumes, preemptions=self.preemptions, deaths=self.deaths,
            num_preemptible=self.num_preemptible, trainer_idle_s=self.trainer_idle_s,
            rollout_idle_s=max(0.0, now - done), rollout_time_s=done - self.started_at,
            step_time_s=now - self.started_at, reopened=self.reopened, duplicates=duplicates, gaps=gaps,
            kv_migrations=self.kv_migrations, trimmed_tokens=self.trimmed_tokens, early_s=self.early_s,
            early_tokens=self.early_tokens, preempted_samples=self.preempted_samples,
            preempted_reprefill_tokens=self.preempted_reprefill_tokens,
            preempted_regenerated_tokens=self.preempted_regenerated_tokens)
