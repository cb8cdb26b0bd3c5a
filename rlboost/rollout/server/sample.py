"""A sample streamed by an engine that runs in processes of its own (SGLang, vLLM): the
state it came with, the tokens received since, and the request producing the next ones;
and where its output ends (its first stop token or its max_new_tokens), whatever the engine
reports. Shared by the adapters, which differ in how they ask and what answers look like."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from rlboost.migration.state import RequestState

Pairs = list[tuple[int, float]]  # (token id, logprob)
_SEED_BITS = 31  # SGLang packs per-request seeds into an int32 tensor (vLLM takes any int)


@dataclass(slots=True)
class StreamedSample:
    """An admitted sample: its state, the tokens received since admission, and the engine
    request (rid) producing the next ones; a resumed or continued sample is re-prefilled
    from current()."""

    state: RequestState
    rid: str
    ids: list[int] = field(default_factory=list)          # output received since admission
    logprobs: list[float] = field(default_factory=list)
    segment_start: int = 0   # len(ids) when the current request began
    emitted: int = 0         # len(ids) already handed out in deltas

    @property
    def sample_id(self) -> int:
        return self.state.sample_id

    @property
    def output_len(self) -> int:
        return len(self.state.output_ids) + len(self.ids)

    @property
    def remaining(self) -> int:
        return self.state.params.max_new_tokens - self.output_len

    def current(self) -> RequestState:
        """The state with every token received (for export and continuation)."""
        return self.state.extended(tuple(self.ids), tuple(self.logprobs))


def cut_at_stop(sample: StreamedSample, pairs: Pairs) -> tuple[Pairs, str | None]:
    """Keep the pairs up to the sample's first stop token or its max_new_tokens, whichever
    comes first, whatever the engine reports (its finish may come a chunk later)."""
    stops = sample.state.params.stop_token_ids
    room = sample.remaining
    for i, (token, _) in enumerate(pairs[:room]):
        if token in stops:
            return pairs[:i + 1], "stop"
    if len(pairs) >= room:
        return pairs[:room], "length"
    return pairs, None


def sampling_seed(seed: int, sample_id: int) -> int:
    """An engine's per-request seed for a sample: the sample id is folded in, so two samples of
    one prompt and seed still differ."""
    digest = hashlib.blake2b(f"{seed}:{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)
