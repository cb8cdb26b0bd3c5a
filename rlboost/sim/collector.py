"""SimCollector: a simulated step's samples, counted rather than stored token by token.

It answers the queries the controller's StepDecisions asks of a step's collector (missing,
progress, position, max_new, max_length, tokens, all_done), so the simulator runs the
controller's own decisions, and releases complete groups in micro-batches by the live
collector's own rule (controller.collector.release).
A sample on an engine reports what that engine has produced by now. Every sample keeps the
weight versions of its tokens as controller.staleness change points: its tokens come from
the version of the engine that produced them, and an engine that takes a new version
mid-sample starts a new run there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from rlboost.controller.collector import releasable, release
from rlboost.controller.staleness import VersionChanges, extend_changes
from rlboost.rollout.emulated.schedule import BatchSchedule


@dataclass(frozen=True, slots=True)
class SimGroup:
    """One prompt group: its sample ids, prompt length and each sample's final length."""

    group_id: int
    sample_ids: tuple[int, ...]
    prompt_len: int
    lengths: tuple[int, ...]
    max_new: int


@dataclass(frozen=True, slots=True)
class SimBatch:
    """Complete groups for the trainer: their response tokens, each sample's prompt + response
    length, and `last`."""

    groups: tuple[tuple[int, int], ...]  # (group id, response tokens)
    lengths: tuple[int, ...]
    last: bool

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return sum(tokens for _, tokens in self.groups)


class _Sample:
    __slots__ = ("group", "length", "progress", "done", "engine", "version", "changes", "marked")

    def __init__(self, group: SimGroup, length: int):
        self.group, self.length = group, length
        self.progress = 0
        self.done = False
        self.engine: BatchSchedule | None = None
        self.version = 0  # the weight version producing its tokens now
        self.changes: VersionChanges = ()  # version change points of its first `marked` tokens
        self.marked = 0

    def mark(self, upto: int) -> None:
        """Record its tokens up to `upto` as the current version's, or forget those past it
        (tokens it lost or gave up)."""
        if upto >= self.marked:
            self.changes = extend_changes(self.changes, self.marked, upto - self.marked, self.version)
        else:
            self.changes = tuple(c for c in self.changes if c[0] < upto)
        self.marked = upto


class SimCollector:
    """Every sample of a step, its collected progress, and the micro-batches of complete groups."""

    def __init__(self, groups: Sequence[SimGroup], *, min_samples: int, max_samples: int | None = None):
        if not groups:
            raise ValueError("a step needs at least one prompt group")
        self.min_samples, self.max_samples = min_samples, max_samples
        self._groups = {g.group_id: g for g in groups}
        self._samples = {sid: _Sample(g, n) for g in groups for sid, n in zip(g.sample_ids, g.lengths)}
        self._left = {g.group_id: len(g.sample_ids) for g in groups}
        self._missing = dict.fromkeys(self._samples)  # ordered set of unfinished samples
        self._ready: deque[int] = deque()
        self._emitted = 0
        self.completed_at: dict[int, float] = {}
        self._settled_tokens = 0  # tokens of samples not on an engine

    # -- what StepDecisions asks ---------------------------------------------------------------

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(self._samples)

    def __contains__(self, sid: int) -> bool:
        return sid in self._samples

    def missing(self) -> tuple[int, ...]:
        return tuple(self._missing)

    def finished(self, sid: int) -> bool:
        return self._samples[sid].done

    def progress(self, sid: int) -> int:
        s = self._samples[sid]
        return s.engine.produced(sid) if s.engine is not None else s.progress

    def position(self, sid: int) -> int:
        return self._samples[sid].group.prompt_len + self.progress(sid)

    def max_new(self, sid: int) -> int:
        return self._samples[sid].group.max_new

    def max_length(self, sid: int) -> int:
        g = self._samples[sid].group
        return g.prompt_len + g.max_new

    @property
    def tokens(self) -> int:
        """Tokens collected so far (those being produced on engines included)."""
        return self._settled_tokens + sum(s.engine.produced(sid) for sid, s in self._samples.items()
                                           if s.engine is not None)

    @property
    def all_done(self) -> bool:
        return not self._missing

    duplicates = 0  # counted samples never arrive twice, nor with gaps
    gaps = 0

    # -- what the simulator does ---------------------------------------------------------------

    def length(self, sid: int) -> int:
        return self._samples[sid].length

    def prompt_len(self, sid: int) -> int:
        return self._samples[sid].group.prompt_len

    def group_of(self, sid: int) -> SimGroup:
        return self._samples[sid].group

    @property
    def sequence_tokens(self) -> int:
        """Prompt + response tokens of every sample of the step."""
        return sum(g.prompt_len * len(g.lengths) + sum(g.lengths) for g in self._groups.values())

    def changes(self, sid: int) -> tuple[VersionChanges, int]:
        """The sample's version change points and the tokens they cover (controller.staleness)."""
        s = self._samples[sid]
        return s.changes, s.marked

    def group_id(self, sid: int) -> int:
        return self._samples[sid].group.group_id

    def trim(self, sid: int, keep: int) -> int:
        """Drop an unfinished sample's tokens past the first `keep` (controller.continuation);
        returns how many were dropped."""
        s = self._samples[sid]
        if s.done:
            raise ValueError(f"sample {sid} is finished; only unfinished samples are trimmed")
        drop = max(0, self.progress(sid) - max(0, keep))
        if drop:
            self.lift(sid, self.progress(sid) - drop)
        return drop

    def group_samples(self, group_id: int) -> tuple[int, ...]:
        return self._groups[group_id].sample_ids

    def finished_shortest(self, sids) -> dict[int, int]:
        """For the groups of sids: the shortest length among each one's finished members."""
        out: dict[int, int] = {}
        for g in {self._samples[sid].group for sid in sids}:
            done = [n for sid, n in zip(g.sample_ids, g.lengths) if self._samples[sid].done]
            if done:
                out[g.group_id] = min(done)
        return out

    def place(self, sid: int, engine: BatchSchedule, version: int = 0) -> None:
        """The sample runs on this engine, which holds weight `version`, from now on (its
        progress is the engine's)."""
        s = self._samples[sid]
        self._settled_tokens -= s.progress
        s.engine, s.version = engine, version

    def version_changed(self, sid: int, version: int) -> None:
        """The sample's engine took weight `version`: its tokens from now on are that version's."""
        s = self._samples[sid]
        if s.engine is not None:
            s.mark(s.engine.produced(sid))
        s.version = version

    def lift(self, sid: int, progress: int | None = None) -> int:
        """The sample leaves its engine with what it produced (or `progress`, e.g. a trimmed
        group's, or the last collected tokens of a lost instance); returns its progress."""
        s = self._samples[sid]
        if s.engine is not None:
            produced = s.engine.produced(sid)
            s.engine = None
            s.progress = produced
            self._settled_tokens += produced
        if progress is not None and progress != s.progress:
            self._settled_tokens += progress - s.progress
            s.progress = progress
        s.mark(s.progress)
        return s.progress

    def finish(self, sid: int, now: float) -> None:
        """The sample's last token arrived at `now`."""
        s = self._samples[sid]
        self.lift(sid, s.length)
        if s.done:
            raise AssertionError(f"sample {sid} finished twice")
        s.done = True
        del self._missing[sid]
        gid = s.group.group_id
        self._left[gid] -= 1
        if self._left[gid] == 0:
            self._ready.append(gid)
            self.completed_at[gid] = now

    @property
    def all_taken(self) -> bool:
        """Whether the trainer has taken every group (the last micro-batch included)."""
        return self._emitted == len(self._groups)

    def ready_samples(self) -> int:
        return sum(len(self._groups[g].sample_ids) for g in self._ready)

    def take_ready(self) -> bool:
        """Whether take() would return a micro-batch now."""
        return releasable(self._ready, self._size, min_samples=self.min_samples, all_done=self.all_done)

    def _size(self, group_id: int) -> int:
        return len(self._groups[group_id].sample_ids)

    def take(self) -> SimBatch | None:
        """The next micro-batch, by the live collector's rule (controller.collector.release)."""
        gids = release(self._ready, self._size, min_samples=self.min_samples,
                       max_samples=self.max_samples, all_done=self.all_done)
        if not gids:
            return None
        groups, lengths = [], []
        for gid in gids:
            g = self._groups[gid]
            groups.append((gid, sum(g.lengths)))
            lengths += [g.prompt_len + n for n in g.lengths]
        self._emitted += len(gids)
        return SimBatch(tuple(groups), tuple(lengths), last=self._emitted == len(self._groups))
