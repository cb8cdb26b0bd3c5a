"""The shape of one engine's paged KV cache: a record the controller compares between
engines, kept apart from the page copies (rlboost.migration.kv) so that the records that
carry it, and the controller's modules, import no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

KV_FORMAT_VERSION = 1
_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class KVLayout:
    """Shape of one engine's paged KV cache.

    >>> KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, block_size=16, dtype="float32").token_bytes
    1024
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    format_version: int = KV_FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def itemsize(self) -> int:
        return _DTYPES[self.dtype]

    @property
    def token_bytes(self) -> int:
        """Bytes of K and V for one token across all layers."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def compatible_with(self, other: KVLayout) -> bool:
        """Whether pages gathered in this layout can be scattered into a cache of `other`:
        the same per-token shape and dtype (block sizes may differ, pages are token-ordered).

        >>> a = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, block_size=16, dtype="float32")
        >>> a.compatible_with(KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, block_size=64,
        ...                            dtype="float32"))
        True
        """
        return (self.num_layers, self.num_kv_heads, self.head_dim, self.dtype) == (
            other.num_layers, other.num_kv_heads, other.head_dim, other.dtype)

    def cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of a paged cache with num_blocks blocks in this layout."""
        return (self.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
