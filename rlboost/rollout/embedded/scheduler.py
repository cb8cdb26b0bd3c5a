"""Continuous-batching scheduler of the embedded engine: which samples run this step, how
many tokens each feeds, and who owns which KV blocks.

Samples join when blocks allow and leave when they finish, every step. A running sample
that needs a block when none is free evicts the most recently admitted sample, which goes
back to the head of the queue and is re-prefilled later (deterministic sampling makes the
detour invisible in its tokens).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from rlboost.migration.state import RequestState
from rlboost.rollout.embedded.forward import Chunk
from rlboost.rollout.embedded.kv_cache import PagedKVCache, blocks_for


@dataclass(eq=False, slots=True)
class EngineSample:
    """A sample inside the engine: its tokens so far and where its K/V lives."""

    state: RequestState                 # as submitted (prompt, params, seed, version)
    tokens: list[int]                   # prompt + output
    out_ids: list[int]
    out_logprobs: list[float]
    emitted: int                        # output tokens already handed out (or known on submit)
    kv_len: int = 0                     # positions whose K/V is in the cache
    blocks: list[int] = field(default_factory=list)
    pending_kv: tuple[int, torch.Tensor] | None = None  # imported pages not yet placed
    finish_reason: str | None = None

    @classmethod
    def from_state(cls, state: RequestState) -> EngineSample:
        return cls(state=state, tokens=[*state.prompt_ids, *state.output_ids],
                   out_ids=list(state.output_ids), out_logprobs=list(state.output_logprobs),
                   emitted=len(state.output_ids))

    @property
    def sample_id(self) -> int:
        return self.state.sample_id

    @property
    def remaining(self) -> int:
        return 0 if self.finish_reason else self.state.params.max_new_tokens - len(self.out_ids)


class Scheduler:
    """Waiting queue, running set and block ownership; driven by one thread only."""

    def __init__(self, cache: PagedKVCache, *, max_batch_size: int, max_prefill_tokens: int, scatter):
        self.cache = cache
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[EngineSample] = deque()
        self.running: list[EngineSample] = []
        self.by_id: dict[int, EngineSample] = {}
        self._scatter = scatter  # (cache, blocks, kv_tokens, data) -> None
        self._watermark = max(1, cache.allocator.num_blocks // 100)
        self.evictions = 0

    def add(self, seq: EngineSample) -> None:
        self.by_id[seq.sample_id] = seq
        self.waiting.append(seq)

    def remove(self, sample_id: int) -> EngineSample | None:
        seq = self.by_id.pop(sample_id, None)
        if seq is None:
            return None
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._release(seq)
        return seq

    def _release(self, seq: EngineSample) -> None:
        self.cache.allocator.free(seq.blocks)
        seq.blocks = []
        seq.kv_len = 0

    def plan(self) -> list[tuple[EngineSample, Chunk]]:
        """Admit what fits, make room for every decode, and cut this step's chunks."""
        self._admit()
        self._reserve_decode_slots()
        budget = self.max_prefill_tokens
        plan = []
        for seq in self.running:
            todo = len(seq.tokens) - seq.kv_len
            if todo > 1:
                if budget == 0:
                    continue
                todo = min(todo, budget)
                budget -= todo
            end = seq.kv_len + todo
            plan.append((seq, Chunk(seq.tokens[seq.kv_len:end], seq.kv_len, seq.blocks,
                                    wants_logits=end == len(seq.tokens))))
        return plan

    def _admit(self) -> None:
        alloc = self.cache.allocator
        while self.waiting and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            need = blocks_for(len(seq.tokens), self.cache.block_size)
            if alloc.num_free - need < (self._watermark if self.running else 0):
                return
            self.waiting.popleft()
            seq.blocks = alloc.allocate(need)
            if seq.pending_kv is not None:
                kv_tokens, data = seq.pending_kv
                self._scatter(seq.blocks, kv_tokens, data)
                # The last known token is always fed again, to get the logits it produces.
                seq.kv_len = min(kv_tokens, len(seq.tokens) - 1)
                seq.pending_kv = None
            self.running.append(seq)

    def _reserve_decode_slots(self) -> None:
        """Give each running sample the blocks its next fed token needs, evicting if short."""
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            need = blocks_for(len(seq.tokens), self.cache.block_size) - len(seq.blocks)
            while need > 0 and self.cache.allocator.num_free < need and self.running[-1] is not seq:
                self._evict(self.running[-1])
            if need > 0 and self.cache.allocator.num_free < need:
                self._evict(seq)
                continue
            if need > 0:
                seq.blocks += self.cache.allocator.allocate(need)
            i += 1

    def _evict(self, seq: EngineSample) -> None:
        self.evictions += 1
        self.running.remove(seq)
        self._release(seq)
        self.waiting.appendleft(seq)

    def finish(self, seq: EngineSample) -> None:
        self.running.remove(seq)
        del self.by_id[seq.sample_id]
        self._release(seq)

    def queued_tokens(self) -> int:
        return sum(s.remaining for s in self.by_id.values())
