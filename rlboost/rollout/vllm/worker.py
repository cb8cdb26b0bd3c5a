"""RlboostWorkerExtension: what vLLM mixes into each of its workers (AsyncEngineArgs
worker_extension_cls), so `collective_rpc("rlboost_load_weights", args=(path, entries))`
loads a shared-memory bucket (rlboost.rollout.vllm.weights) into the worker's model.

Runs inside vLLM's worker processes: it sees the worker as `self` (its model_runner), and
imports nothing of vLLM. Every name starts with rlboost_, so it clashes with no worker
attribute (vLLM refuses an extension that would).
"""

from __future__ import annotations

import mmap
import os

import torch


class RlboostWorkerExtension:
    def rlboost_load_weights(self, path: str, entries: list) -> int:
        """Map the bucket at path and load its tensors with the model's own load_weights
        (which shards them for this worker's TP rank); returns how many were handed over."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            # private and writable (copy on write): tensors over it need no read-only warning
            with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE) as mm:
                flat = torch.frombuffer(mm, dtype=torch.uint8)
                weights = []
                for name, dtype, shape, offset in entries:
                    want = getattr(torch, dtype)
                    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=want).element_size()
                    weights.append((name, flat[offset:offset + nbytes].view(want).view(tuple(shape))))
                self.model_runner.get_model().load_weights(weights=weights)
                count = len(weights)
                del weights, flat  # no view of the map may outlive it
        finally:
            os.close(fd)
        return count
