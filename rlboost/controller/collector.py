"""Collector: every sample of a step accounted for exactly once, token by token.

Deltas are deduplicated by their start offset and gaps are detected; a prompt group is
released to the trainer only when all of its samples have finished, in micro-batches of at
least a configured size (a multiple of the group size, so a group is never split).

A multi-turn step (episodes=True) ends a sample's turn, not the sample, when it stops: the
sample waits for its environment's answer (awaiting), whose observation tokens are then
appended to its output, masked as not the model's, before it runs on (Collector.observe).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

from rlboost.controller.records import CompletedGroup, CompletedSample, GroupBatch, PromptGroup
from rlboost.controller.staleness import accepted_versions, extend_changes, truncate_changes
from rlboost.errors import ProtocolError, StaleSampleError
from rlboost.migration.state import RequestState
from rlboost.rollout.engine import TokenDelta

APPLIED, DUPLICATE, GAP, FOREIGN = "applied", "duplicate", "gap", "foreign"


class _Progress:
    __slots__ = ("group", "ids", "logprobs", "finish_reason", "min_version", "changes", "turn_ends", "observed",
                 "awaiting", "turn_reason", "reward")

    def __init__(self, group: PromptGroup):
        self.group = group
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.min_version: int | None = None
        self.changes: tuple[tuple[int, int], ...] = ()  # (token index, version) where the version changed
        self.turn_ends: list[int] = []  # episodes: where each model turn ended (output index)
        self.observed: list[tuple[int, int]] = []  # episodes: [start, end) of each observation in the output
        self.awaiting = False  # episodes: the turn ended; its environment's answer is pending
        self.turn_reason: str | None = None  # episodes: how the last turn ended
        self.reward: float | None = None  # episodes: the reward the environment gave, if any

    def turn_start(self) -> int:
        """Where the model's current (or last) turn starts in the output."""
        return self.observed[-1][1] if self.observed else 0

    def model_mask(self) -> tuple[bool, ...]:
        """One flag per output token: True where the model wrote it (empty: all of them)."""
        if not self.observed:
            return ()
        mask = [True] * len(self.ids)
        for start, end in self.observed:
            mask[start:end] = [False] * (end - start)
        return tuple(mask)


class Collector:
    """Tokens of one step's samples, and the micro-batches of complete groups they make."""

    def __init__(self, step: int, groups: Sequence[PromptGroup], weight_version: int, *,
                 microbatch_min_samples: int, microbatch_max_samples: int | None = None,
                 max_staleness: int = 0, episodes: bool = False):
        if not groups:
            raise ValueError("a step needs at least one prompt group")
        ids = [g.group_id for g in groups]
        if len(set(ids)) != len(ids):
            raise ValueError("group_id values of a step must be unique")
        for g in groups:
            if microbatch_min_samples < 1 or microbatch_min_samples % g.num_samples:
                raise ValueError(f"microbatch_min_samples ({microbatch_min_samples}) must be a positive "
                                 f"multiple of every group's num_samples (group {g.group_id} has {g.num_samples})")
        if microbatch_max_samples is not None and microbatch_max_samples < microbatch_min_samples:
            raise ValueError("microbatch_max_samples must be >= microbatch_min_samples")
        self.step = step
        self.weight_version = weight_version
        self.max_staleness = max_staleness
        self.window = accepted_versions(weight_version, max_staleness)
        self.min_samples = microbatch_min_samples
        self.max_samples = microbatch_max_samples
        self._groups = {g.group_id: g for g in groups}
        self._samples = {sid: _Progress(g) for g in groups for sid in g.sample_ids}
        self._left = {g.group_id: g.num_samples for g in groups}
        self._ready: deque[int] = deque()
        self._emitted: set[int] = set()
        self.completed_at: dict[int, float] = {}
        self.tokens = 0
        self.duplicates = 0
        self.gaps = 0
        self.episodes = episodes
        self._turns_ended: list[int] = []  # episodes: samples whose turn ended, for the episode driver

    # -- per-sample queries ------------------------------------------------------------------

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(self._samples)

    def knows(self, sample_id: int) -> bool:
        return sample_id in self._samples

    __contains__ = knows

    def finished(self, sample_id: int) -> bool:
        return self._samples[sample_id].finish_reason is not None

    def progress(self, sample_id: int) -> int:
        return len(self._samples[sample_id].ids)

    def model_tokens(self, sample_id: int) -> int:
        """Output tokens the model wrote (an episode's observations left out)."""
        p = self._samples[sample_id]
        return len(p.ids) - sum(end - start for start, end in p.observed)

    def position(self, sample_id: int) -> int:
        p = self._samples[sample_id]
        return len(p.group.prompt_ids) + len(p.ids)

    def max_new(self, sample_id: int) -> int:
        return self._samples[sample_id].group.params.max_new_tokens

    def max_length(self, sample_id: int) -> int:
        """Longest the sample can become: prompt + max_new_tokens."""
        g = self._samples[sample_id].group
        return len(g.prompt_ids) + g.params.max_new_tokens

    def state_of(self, sample_id: int, weight_version: int) -> RequestState:
        """The sample as collected so far, ready to resume on an engine holding weight_version."""
        p = self._samples[sample_id]
        return RequestState(sample_id=sample_id, prompt_ids=p.group.prompt_ids, params=p.group.params,
                            seed=p.group.seed, weight_version=weight_version, output_ids=tuple(p.ids),
                            output_logprobs=tuple(p.logprobs), finish_reason=p.finish_reason)

    def missing(self) -> tuple[int, ...]:
        return tuple(sid for sid, p in self._samples.items() if p.finish_reason is None)

    def group_id(self, sample_id: int) -> int:
        return self._samples[sample_id].group.group_id

    def finished_shortest(self, sample_ids) -> dict[int, int]:
        """For the groups of sample_ids: the shortest output among each one's finished members."""
        out: dict[int, int] = {}
        for gid in {self.group_id(s) for s in sample_ids}:
            done = [len(self._samples[s].ids) for s in self._groups[gid].sample_ids
                    if self._samples[s].finish_reason is not None]
            if done:
                out[gid] = min(done)
        return out

    def trim(self, sample_id: int, keep: int) -> int:
        """Drop an unfinished sample's tokens past the first `keep` (it regenerates them where it
        resumes: the reference's group continuation); returns how many were dropped. An
        episode keeps its earlier turns and observations (only its current turn is cut),
        unless keep is 0: then it restarts from its prompt, as a whole."""
        p = self._samples[sample_id]
        if p.finish_reason is not None or p.awaiting:
            raise ValueError(f"sample {sample_id} is finished; only unfinished samples are trimmed")
        written = self.model_tokens(sample_id)
        if keep <= 0:
            p.observed.clear()
            p.turn_ends.clear()
        drop = max(0, len(p.ids) - max(p.turn_start(), keep))
        if drop:
            del p.ids[len(p.ids) - drop:]
            del p.logprobs[len(p.logprobs) - drop:]
            self.tokens -= written - self.model_tokens(sample_id)  # observations were never counted
            p.changes = truncate_changes(p.changes, len(p.ids))
        return drop

    @property
    def all_done(self) -> bool:
        return not any(self._left.values())

    # -- intake ------------------------------------------------------------------------------

    def apply(self, delta: TokenDelta, now: float = 0.0) -> str:
        """Add a delta's new tokens; returns applied, duplicate, gap (not applied) or foreign.
        `now` is recorded as the completion time of a group the delta completes."""
        p = self._samples.get(delta.sample_id)
        if p is None:
            return FOREIGN
        if delta.weight_version not in self.window:
            raise StaleSampleError(
                f"sample {delta.sample_id} got tokens from weight version {delta.weight_version}; step "
                f"{self.step} accepts {self.window.start}..{self.window.stop - 1}")
        return self._merge(delta.sample_id, p, delta.start, delta.ids, delta.logprobs,
                           delta.finish_reason, delta.weight_version, now=now)

    def absorb(self, state: RequestState, weight_version: int, now: float = 0.0) -> str:
        """Take the full output of an exported state (tokens not polled yet included)."""
        p = self._samples.get(state.sample_id)
        if p is None:
            return FOREIGN
        return self._merge(state.sample_id, p, 0, state.output_ids, state.output_logprobs,
                           state.finish_reason, weight_version, now=now, count_duplicate=False)

    def _merge(self, sid: int, p: _Progress, start: int, ids, logprobs, finish_reason, version, *,
               now: float, count_duplicate: bool = True) -> str:
        if len(ids) != len(logprobs):  # records that crossed a process skip their own checks
            raise ProtocolError(f"sample {sid}: {len(ids)} token ids but {len(logprobs)} logprobs")
        have = len(p.ids)
        if start > have:
            self.gaps += 1
            return GAP
        overlap = min(have - start, len(ids))
        if list(ids[:overlap]) != p.ids[start:start + overlap]:
            raise ProtocolError(f"sample {sid} diverged at token {start}: an engine is not deterministic "
                                f"for (seed, sample_id, position)")
        new_ids = ids[overlap:]
        if (p.finish_reason is not None or p.awaiting) and new_ids:
            raise ProtocolError(f"sample {sid} got tokens after it finished ({p.finish_reason or p.turn_reason})")
        if p.finish_reason is not None or p.awaiting or (not new_ids and finish_reason is None):
            self.duplicates += count_duplicate
            return DUPLICATE
        p.changes = extend_changes(p.changes, have, len(new_ids), version)
        p.ids.extend(new_ids)
        p.logprobs.extend(logprobs[overlap:])
        self.tokens += len(new_ids)
        p.min_version = version if p.min_version is None else min(p.min_version, version)
        if finish_reason is not None and self.episodes:
            p.awaiting, p.turn_reason = True, finish_reason
            p.turn_ends.append(len(p.ids))
            self._turns_ended.append(sid)
        elif finish_reason is not None:
            self._finish(p, finish_reason, now)
        return APPLIED

    def _finish(self, p: _Progress, finish_reason: str, now: float) -> None:
        p.finish_reason = finish_reason
        self._left[p.group.group_id] -= 1
        if self._left[p.group.group_id] == 0:
            self._ready.append(p.group.group_id)
            self.completed_at[p.group.group_id] = now

    # -- episodes (multi-turn) ------------------------------------------------------------------

    def awaiting(self, sample_id: int) -> bool:
        """Whether the sample's turn ended and its environment has not answered yet."""
        return self._samples[sample_id].awaiting

    def take_turn_ends(self) -> list[int]:
        """Samples whose turn ended since the last call, each once per turn."""
        out, self._turns_ended = self._turns_ended, []
        return out

    def turn(self, sample_id: int) -> tuple[int, tuple[int, ...], str]:
        """The sample's last finished turn: its index, the tokens the model wrote in it, and
        how it ended."""
        p = self._samples[sample_id]
        if not p.awaiting:
            raise ValueError(f"sample {sample_id} has no turn waiting for its environment")
        return len(p.turn_ends) - 1, tuple(p.ids[p.turn_start():p.turn_ends[-1]]), p.turn_reason

    def observe(self, sample_id: int, ids: Sequence[int], *, done: bool, reward: float | None = None,
                now: float = 0.0) -> None:
        """The environment's answer to the sample's last turn: done ends the sample (with how
        its last turn ended, and the reward the environment gave, if any); else the observation's tokens follow the turn, and the sample
        runs on from them. Observation tokens are not generated tokens: they are not counted
        in `tokens`, carry log-probability 0 and take the version of the turn before them."""
        p = self._samples[sample_id]
        if not p.awaiting:
            raise ValueError(f"sample {sample_id} has no turn waiting for its environment")
        p.awaiting = False
        if done:
            p.reward = reward
            self._finish(p, p.turn_reason, now)
            return
        if not ids:
            raise ValueError(f"sample {sample_id}: an episode that goes on needs observation tokens")
        start = len(p.ids)
        p.ids.extend(int(t) for t in ids)
        p.logprobs.extend([0.0] * len(ids))
        p.observed.append((start, len(p.ids)))

    # -- output ------------------------------------------------------------------------------

    def _group(self, gid: int) -> CompletedGroup:
        g = self._groups[gid]
        samples = []
        for sid in g.sample_ids:
            p = self._samples[sid]
            samples.append(CompletedSample(sample_id=sid, output_ids=tuple(p.ids),
                                           output_logprobs=tuple(p.logprobs), finish_reason=p.finish_reason,
                                           weight_version=p.min_version if p.min_version is not None
                                           else self.weight_version,
                                           version_changes=p.changes if len(set(v for _, v in p.changes)) > 1
                                           else (), model_mask=p.model_mask(), turns=len(p.turn_ends),
                                           answer_start=p.turn_start(), environment_reward=p.reward))
        return CompletedGroup(group_id=gid, prompt_ids=g.prompt_ids, samples=tuple(samples))

    def ready_samples(self) -> int:
        return sum(self._groups[g].num_samples for g in self._ready)

    def take(self) -> GroupBatch | None:
        """The next micro-batch, when enough complete groups are ready (or the step's rest is)."""
        out = []
        for gid in release(self._ready, lambda g: self._groups[g].num_samples, min_samples=self.min_samples,
                           max_samples=self.max_samples, all_done=self.all_done):
            if gid in self._emitted:
                raise AssertionError(f"group {gid} would be emitted twice")
            self._emitted.add(gid)
            out.append(self._group(gid))
        if not out:
            return None
        last = len(self._emitted) == len(self._groups)
        return GroupBatch(step=self.step, groups=tuple(out), last=last)


def release(ready: deque[int], size: Callable[[int], int], *, min_samples: int, max_samples: int | None,
            all_done: bool) -> list[int]:
    """The groups of the next micro-batch, popped off the front of `ready` (complete groups in
    the order they completed; size(group) its samples): none until at least min_samples
    samples are ready or the step is complete, then groups in order up to max_samples samples
    (a first group larger than that goes alone).

    >>> ready = deque([1, 2, 3])
    >>> release(ready, lambda g: 4, min_samples=8, max_samples=8, all_done=False), ready
    ([1, 2], deque([3]))
    >>> release(ready, lambda g: 4, min_samples=8, max_samples=8, all_done=False)
    []
    >>> release(ready, lambda g: 4, min_samples=8, max_samples=8, all_done=True)
    [3]
    """
    if not releasable(ready, size, min_samples=min_samples, all_done=all_done):
        return []
    out, n = [], 0
    while ready:
        k = size(ready[0])
        if max_samples is not None and out and n + k > max_samples:
            break
        out.append(ready.popleft())
        n += k
    return out


def releasable(ready: deque[int], size: Callable[[int], int], *, min_samples: int, all_done: bool) -> bool:
    """Whether release() would give a micro-batch now."""
    return bool(ready) and (all_done or sum(size(g) for g in ready) >= min_samples)
