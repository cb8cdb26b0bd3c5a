"""KV-cache page layout and the pages of migrating samples, as records.

The paged cache every engine in rlboost uses for migration is one contiguous tensor
shaped [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] (2 = key, value).
A sample owns a list of block ids (its block table); its first `num_tokens` token slots
across those blocks hold valid K/V.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    def block_bytes(self) -> int:
        """Bytes of one block of one layer's K (or V)."""
        return self.block_size * self.num_kv_heads * self.head_dim * self.itemsize
