"""Which request states an engine may admit: the checks every engine applies the same way,
so a batch is refused whole (RolloutError naming the sample) before anything changes.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from rlboost.errors import RolloutError
from rlboost.migration.state import RequestState


def validate_states(states: Sequence, *, known: Container[int], version: int, vocab_size: int,
                    max_model_len: int | None) -> None:
    """Refuse the whole list if any state cannot run on an engine holding `version`.

    known: sample ids already admitted; max_model_len: longest prompt + output the engine
    takes (None: no limit).
    """
    seen: set[int] = set()
    for s in states:
        if not isinstance(s, RequestState):
            raise RolloutError(f"expected RequestState, got {type(s).__name__}")
        sid = s.sample_id
        if sid in known or sid in seen:
            raise RolloutError(f"sample {sid} is already admitted")
        seen.add(sid)
        if s.weight_version != version:
            raise RolloutError(f"sample {sid} is for weight version {s.weight_version}, "
                               f"this engine has version {version} loaded")
        if s.finished or s.remaining_tokens <= 0:
            raise RolloutError(f"sample {sid} has nothing left to generate "
                               f"(finish_reason={s.finish_reason!r}, {len(s.output_ids)} tokens)")
        ids = (*s.prompt_ids, *s.output_ids)
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise RolloutError(f"sample {sid} has token ids outside [0, {vocab_size})")
        total = len(s.prompt_ids) + s.params.max_new_tokens
        if max_model_len is not None and total > max_model_len:
            raise RolloutError(f"sample {sid} may reach {total} tokens, more than this engine's "
                               f"max_model_len {max_model_len}")
