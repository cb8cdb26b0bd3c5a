"""MigrationBatch: the in-flight samples one engine hands to another, with optional KV pages.

A record only; engines build it in export_states() and consume it in import_states().
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlboost.migration.kv import KVLayout
from rlboost.migration.state import RequestState

BATCH_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class MigrationBatch:
    """Samples leaving an engine: their states and, when exported with KV, their pages.

    >>> from rlboost.migration.state import SamplingParams
    >>> s = RequestState(sample_id=1, prompt_ids=(1, 2), params=SamplingParams(), seed=0, weight_version=0)
    >>> MigrationBatch(states=(s,), kv_layout=None, kv_tokens=None, kv_data=None).states[0].sample_id
    1

    kv_tokens[i] is how many positions of states[i] have K/V in kv_data[i] (a 1-D uint8
    tensor of kv_tokens[i] * kv_layout.token_bytes bytes).
    """

    states: tuple[RequestState, ...]
    kv_layout: KVLayout | None = None
    kv_tokens: tuple[int, ...] | None = None
    kv_data: tuple[Any, ...] | None = None
    format_version: int = BATCH_FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.format_version != BATCH_FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version} is not {BATCH_FORMAT_VERSION}")
        has_kv = [self.kv_layout is not None, self.kv_tokens is not None, self.kv_data is not None]
        if any(has_kv) and not all(has_kv):
            raise ValueError("kv_layout, kv_tokens and kv_data must be all set or all None")
        if self.kv_tokens is not None and not (
                len(self.kv_tokens) == len(self.kv_data) == len(self.states)):
            raise ValueError("kv_tokens and kv_data need one entry per state")
