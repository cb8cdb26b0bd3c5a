"""Records that cross between the controller, rollout instances and the trainer.

Each is frozen and versioned because it travels through Ray between processes; the
controller's mutable bookkeeping lives in the modules that own it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.controller.staleness import check_changes
from rlboost.migration.layout import KVLayout
from rlboost.migration.state import RequestState, SamplingParams
from rlboost.validate import check_format_version

RECORD_FORMAT_VERSION = 1
INSTANCE_KINDS = ("reserved", "preemptible")
GROUP_STRIDE = 1 << 16  # sample ids of group g are g * GROUP_STRIDE + 0 .. num_samples - 1


def _check_version(record) -> None:
    check_format_version(record, RECORD_FORMAT_VERSION)


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceInfo:
    """A rollout instance as it introduces itself.

    >>> InstanceInfo(instance_id="spot-3", kind="preemptible", capacity=64, relay_address="10.0.0.7:7000").kind
    'preemptible'

    capacity is how many samples it decodes at once; the controller never queues more
    than that on it, so everything else stays cheap to move. max_model_len is the longest
    prompt + output its engine accepts (None: no limit declared); a sample that cannot fit
    is never offered to it. kv_layout is set when it speaks the handoff protocol
    (rlboost.migration.endpoint): KV pages of migrating samples then move engine to engine,
    to targets whose layout is compatible. relay_address is where its weight relay serves
    what it holds: the controller names it to the others in their leases, as a source to
    pull from. source (who placed it), pid and host (its process) go into its events.
    """

    instance_id: str
    kind: str
    capacity: int
    relay_address: str = ""
    max_model_len: int | None = None
    kv_layout: KVLayout | None = None
    source: str = ""
    pid: int = 0
    host: str = ""
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)
        if not self.instance_id:
            raise ValueError("instance_id must not be empty")
        if self.kind not in INSTANCE_KINDS:
            raise ValueError(f"kind must be one of {INSTANCE_KINDS}, got {self.kind!r}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 or None, got {self.max_model_len}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """The controller's answer to register/heartbeat (and what it pushes when a new weight
    version is current): renew within renew_within_s, hold weight_version.

    >>> Lease(instance_id="spot-3", state="pulling", weight_version=5, renew_within_s=3.0,
    ...       peers=("10.0.0.8:7001",)).peers
    ('10.0.0.8:7001',)

    state is one of joining, pulling, active, draining, gone, lost. An instance whose loaded
    version differs from weight_version pulls that version, from the trainer's publishers
    and from `peers` (the relays of other instances), loads it and reports it.
    """

    instance_id: str
    state: str
    weight_version: int
    renew_within_s: float
    peers: tuple[str, ...] = ()
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class PromptGroup:
    """One prompt and how many samples to draw from it (a GRPO group).

    >>> g = PromptGroup(group_id=2, prompt_ids=(5, 6), params=SamplingParams(max_new_tokens=8),
    ...                 num_samples=2, seed=11)
    >>> g.sample_ids
    (131072, 131073)

    The group is the unit the trainer receives: never split across micro-batches.
    """

    group_id: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    num_samples: int
    seed: int
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)
        if not 0 <= self.group_id < 2 ** 47:
            raise ValueError(f"group_id must be in [0, 2**47), got {self.group_id}")
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if not 1 <= self.num_samples < GROUP_STRIDE:
            raise ValueError(f"num_samples must be in [1, {GROUP_STRIDE}), got {self.num_samples}")

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(self.group_id * GROUP_STRIDE + j for j in range(self.num_samples))

    def states(self, weight_version: int) -> tuple[RequestState, ...]:
        """Fresh request states of every sample, for the given weight version."""
        return tuple(RequestState(sample_id=sid, prompt_ids=self.prompt_ids, params=self.params,
                                  seed=self.seed, weight_version=weight_version)
                     for sid in self.sample_ids)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompletedSample:
    """One finished sample: every output token exactly once, in order.

    >>> CompletedSample(sample_id=1, output_ids=(4, 2), output_logprobs=(-0.5, -0.1),
    ...                 finish_reason="stop", weight_version=3).finish_reason
    'stop'

    weight_version is the oldest version that produced any of its tokens. version_changes,
    for a sample that spans a weight update (bounded staleness, controller.max_staleness):
    the (token index, version) points where the version changed (rlboost.controller.staleness);
    empty when one version produced every token.

    An episode (a multi-turn sample) holds its model turns and the observations between them
    in output_ids: model_mask flags the tokens the model wrote (empty: every token, as for a
    single-turn sample), turns counts its model turns (0: not an episode) and answer_start is
    where its last turn, the answer, starts. environment_reward: the reward its environment
    gave when the episode ended (None: the task's reward scores the answer).
    """

    sample_id: int
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    finish_reason: str
    weight_version: int
    version_changes: tuple[tuple[int, int], ...] = ()
    model_mask: tuple[bool, ...] = ()
    turns: int = 0
    answer_start: int = 0
    environment_reward: float | None = None
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)
        if self.version_changes:
            check_changes(self.version_changes, len(self.output_ids))
        if self.model_mask and len(self.model_mask) != len(self.output_ids):
            raise ValueError(f"sample {self.sample_id}: model_mask ({len(self.model_mask)}) and output_ids "
                             f"({len(self.output_ids)}) differ in length")
        if not 0 <= self.answer_start <= len(self.output_ids) or self.turns < 0:
            raise ValueError(f"sample {self.sample_id}: answer_start must be in [0, {len(self.output_ids)}] and "
                             f"turns >= 0, got {self.answer_start}, {self.turns}")
        if self.finish_reason not in ("stop", "length"):
            raise ValueError(f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CompletedGroup:
    """A prompt group whose samples have all finished.

    >>> s = CompletedSample(sample_id=0, output_ids=(2,), output_logprobs=(-0.1,), finish_reason="stop",
    ...                     weight_version=0)
    >>> CompletedGroup(group_id=0, prompt_ids=(1,), samples=(s,)).num_tokens
    1
    """

    group_id: int
    prompt_ids: tuple[int, ...]
    samples: tuple[CompletedSample, ...]
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.output_ids) for s in self.samples)

    @property
    def model_tokens(self) -> int:
        """Tokens the model wrote (observations of episodes left out)."""
        return sum(sum(s.model_mask) if s.model_mask else len(s.output_ids) for s in self.samples)


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupBatch:
    """Complete groups ready for training (what next_microbatch() returns); `last` marks
    the step's final one. The trainer pads them into rlboost.trainer.batch.MicroBatch tensors.

    >>> GroupBatch(step=4, groups=(), last=True).num_samples
    0
    """

    step: int
    groups: tuple[CompletedGroup, ...]
    last: bool
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)

    @property
    def num_samples(self) -> int:
        return sum(len(g.samples) for g in self.groups)

    @property
    def num_tokens(self) -> int:
        return sum(g.num_tokens for g in self.groups)


MicroBatch = GroupBatch  # the earlier name, kept for callers that import it


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceStatus:
    """One instance as the controller sees it, for status pages and tests.

    >>> InstanceStatus(instance_id="spot-3", kind="preemptible", state="active", weight_version=5,
    ...                samples=12, tokens_per_s=1450.0).samples
    12
    """

    instance_id: str
    kind: str
    state: str
    weight_version: int
    samples: int
    tokens_per_s: float
    format_version: int = RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_version(self)
