"""Weights cut into buckets of about a byte budget, in their order: what the trainer gathers
in one collective and what a rollout engine takes in one update call.

A bucket may have to hold some tensors together. vLLM fuses q/k/v into one qkv_proj and
gate/up into one gate_up_proj (and a MoE layer's experts into one module), and its in-place
reload processes a fused module (repacks it for its kernels) once every part of it has
arrived within one call: a q_proj without its k and v leaves the rest of qkv_proj unset.
Fusions stay inside a decoder layer, so `decoder_layer` keeps each layer whole, and a
bucket never cuts a unit however small its budget (a unit larger than it goes alone).
"""

from __future__ import annotations

import re
from typing import Callable, Hashable, Iterable, Iterator, TypeVar

T = TypeVar("T")
_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def decoder_layer(name: str) -> str:
    """The unit a weight belongs to: its decoder layer, or its own module outside the layers.

    >>> decoder_layer("model.layers.3.self_attn.q_proj.weight"), decoder_layer("model.norm.weight")
    ('model.layers.3', 'model.norm')
    """
    match = _LAYER.match(name)
    return match.group(1) if match else (name.rpartition(".")[0] or name)


def buckets(items: Iterable[T], *, bucket_bytes: int, nbytes: Callable[[T], int],
            unit: Callable[[T], Hashable] | None = None,
            kind: Callable[[T], Hashable] | None = None) -> Iterator[list[T]]:
    """Consecutive buckets of items, each about bucket_bytes (nbytes(item) each).

    unit: consecutive items with the same unit key are never split (a bucket holds whole
    units); kind: a new bucket starts whenever it changes (e.g. a dtype, for a gather into
    one typed buffer). Without either, every item is its own unit.

    >>> sizes = {"a.layers.0.q": 4, "a.layers.0.k": 4, "a.layers.1.q": 4, "a.norm": 2}
    >>> [[n for n in b] for b in buckets(sizes, bucket_bytes=6, nbytes=sizes.get,
    ...                                  unit=decoder_layer)]
    [['a.layers.0.q', 'a.layers.0.k'], ['a.layers.1.q', 'a.norm']]
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[T] = []
    bucket_kind: Hashable = None
    size = 0
    for group, group_kind in _units(items, unit, kind):
        group_bytes = sum(nbytes(item) for item in group)
        if bucket and (size + group_bytes > bucket_bytes or group_kind != bucket_kind):
            yield bucket
            bucket, size = [], 0
        bucket.extend(group)
        bucket_kind = group_kind
        size += group_bytes
    if bucket:
        yield bucket


def _units(items: Iterable[T], unit: Callable[[T], Hashable] | None,
           kind: Callable[[T], Hashable] | None) -> Iterator[tuple[list[T], Hashable]]:
    """Runs of consecutive items with the same unit and kind."""
    run: list[T] = []
    key = None
    for item in items:
        item_key = (unit(item) if unit else object(), kind(item) if kind else None)
        if run and item_key != key:
            yield run, key[1]
            run = []
        run.append(item)
        key = item_key
    if run:
        yield run, key[1]
