"""RlboostWorkerExtension: what vLLM mixes into each of its workers (AsyncEngineArgs
worker_extension_cls), so `collective_rpc("rlboost_load_weights", args=(path, entries))`
loads a shared-memory bucket (rlboost.rollout.vllm.weights) into the worker's model.

Runs inside vLLM's worker processes: it sees the worker as `self` (its model_runner), and
imports nothing of vLLM. Every name starts with rlboost_, so it clashes with no worker
attribute (vLLM refuses an extension that would).

The bucket goes through vLLM's in-place reload (`reload_weights(weights_iterator=...)`)
where the worker has it: the model's own load_weights writes into the layout the model was
built with, which vLLM's CPU kernels replace after loading (each linear weight is packed
and the parameter left empty), and the reload restores that layout, loads, and repacks each
layer once all of its tensors have arrived (buckets hold whole layers:
rlboost.models.buckets). A head tied to the embedding is packed from the embedding's
tensor, which the reload replaces in place, so it is packed again after each bucket.
"""

from __future__ import annotations

import inspect
import logging
import mmap
import os

import torch

# Each reload call checks the tensors it got against the whole model and lists the rest, and
# a tied head that no bucket names is reported as not loaded; with buckets both are expected.
_BUCKET_NOISE = ("Following weights were not loaded", "Failed to load weights")


class RlboostWorkerExtension:
    def rlboost_load_weights(self, path: str, entries: list) -> int:
        """Map the bucket at path and load its tensors (sharded for this worker's TP rank by
        the model's loaders); returns how many were handed over."""
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
                load_into(self, weights)
                count = len(weights)
                del weights, flat  # no view of the map may outlive it
        finally:
            os.close(fd)
        return count


def load_into(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Load (name, tensor) pairs into a vLLM worker's model, then repack tied heads."""
    model = worker.model_runner.get_model()
    reload = _in_place_reload(worker)
    if reload is None:  # releases without an in-place reload: the model's own loader
        model.load_weights(weights=weights)
        return
    quiet = _DropMessages(_BUCKET_NOISE)
    loggers = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{n}") for n in ("inplace", "layerwise")]
    for log in loggers:
        log.addFilter(quiet)
    try:
        reload(weights_iterator=iter(weights))
    finally:
        for log in loggers:
            log.removeFilter(quiet)
    _repack_tied(model, {name for name, _ in weights})


def _in_place_reload(worker):
    """vLLM's in-place reload when this release's model runner has one that takes a weights
    iterator, else None. The worker's own method wraps it in the worker's vLLM config, as
    vLLM's callers have it."""
    runner = getattr(worker.model_runner, "reload_weights", None)
    if runner is None or "weights_iterator" not in inspect.signature(runner).parameters:
        return None
    own = getattr(worker, "reload_weights", None)
    if own is not None:
        params = inspect.signature(own).parameters
        if "weights_iterator" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return own
    return runner


def _repack_tied(model: torch.nn.Module, loaded: set[str]) -> None:
    """Process again every layer whose weight is a loaded layer's (a tied LM head): its kernel
    form was built from the tensor the reload just replaced in place."""
    sharing: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is not None and getattr(module, "quant_method", None) is not None:
            sharing.setdefault(id(weight), []).append((name, module))
    for modules in sharing.values():
        if len(modules) > 1 and any(f"{name}.weight" in loaded for name, _ in modules):
            for _, module in modules:
                if module.weight.numel() > 0:
                    module.quant_method.process_weights_after_loading(module)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(p in message for p in self.prefixes)
