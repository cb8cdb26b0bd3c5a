"""The paged KV cache of the embedded engine: one tensor shaped
[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] (the layout migration
ships), and the allocator that hands out its blocks to samples.
"""

from __future__ import annotations

import torch

from rlboost.migration.layout import KVLayout


class BlockAllocator:
    """Free list of block ids. Lowest ids are handed out first, so runs are reproducible."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() yields 0, 1, ...

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise MemoryError(f"asked for {count} KV blocks, {len(self._free)} free")
        return [self._free.pop() for _ in range(count)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold `tokens` token slots."""
    return -(-tokens // block_size)


class PagedKVCache:
    """The cache tensor, its layout record and its allocator."""

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device):
        dtype_name = str(dtype).removeprefix("torch.")
        self.layout = KVLayout(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                               block_size=block_size, dtype=dtype_name)
        # Zero-filled (and so pre-faulted): stale slots stay finite, and a masked key then
        # contributes exactly 0 to attention.
        self.tensor = torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim,
                                  dtype=dtype, device=device)
        self.allocator = BlockAllocator(num_blocks)
        self.block_size = block_size

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_blocks * self.block_size

    def layer_slots(self, layer: int, kind: int) -> torch.Tensor:
        """[num_blocks * block_size, kv_heads, head_dim] view of one layer's keys (0) or values (1)."""
        t = self.tensor[layer, kind]
        return t.view(-1, t.shape[-2], t.shape[-1])

    def slot_ids(self, blocks: list[int], start: int, end: int) -> list[int]:
        """Flat slot index of each position in [start, end) of a sample with block table `blocks`."""
        bs = self.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(start, end)]
