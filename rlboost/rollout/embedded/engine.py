"""EmbeddedEngine: a continuous-batching torch engine with a paged KV cache, for CPU (tiny
models, tests, first runs) and GPU. It implements the RolloutEngine protocol, including
export/import of in-flight samples with or without their KV pages.

One background thread owns all engine state and runs the decode loop; public methods hand
it commands and wait for their result, so they are thread-safe and take effect between
two steps. Deltas wait in a buffer that poll() drains under a condition variable.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import threading
import time
import warnings
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Callable, Mapping, Sequence, TypeVar

import torch

from rlboost.errors import EngineBusy, RolloutError
from rlboost.migration.state import RequestState
from rlboost.models.checkpoint import load_pretrained
from rlboost.models.decoder import DecoderLM
from rlboost.rollout.admission import validate_states
from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.rollout.embedded.forward import PagedForward
from rlboost.rollout.embedded.inputs import check_import, load_named_tensors
from rlboost.rollout.embedded.kv_cache import PagedKVCache
from rlboost.rollout.embedded.sampling import DrawSpec, draw_key, sample_tokens
from rlboost.rollout.embedded.scheduler import EngineSample, Scheduler
from rlboost.rollout.engine import EngineLoad
from rlboost.rollout.threaded import ThreadedEngineState

__all__ = ["EmbeddedEngine", "EmbeddedEngineConfig"]
T = TypeVar("T")


class EmbeddedEngine(ThreadedEngineState):
    """The embedded rollout engine. Usage:

        engine = EmbeddedEngine(EmbeddedEngineConfig(model_dir="ckpt/", stream_interval=4))
        engine.submit([RequestState(sample_id=1, prompt_ids=(1, 2, 3), seed=0, weight_version=0,
                                    params=SamplingParams(max_new_tokens=64, stop_token_ids=(258,)))])
        deltas = engine.poll(1.0)   # [TokenDelta(sample_id=1, start=0, ids=(...), ...)]
        engine.close()

    A given model is taken over: moved to the configured device and dtype, and written in
    place by load_weights. Stop tokens are exactly `params.stop_token_ids` (the stop token
    is kept in the output). Logprobs are under softmax(logits / temperature), before
    top-k/top-p. Exported and aborted samples leave no undelivered delta behind (an aborted
    sample that finished since the last poll included). `max_model_len` is the longest
    prompt + output a sample may reach here (report it in the instance's InstanceInfo).
    """

    def __init__(self, config: EmbeddedEngineConfig, model: DecoderLM | None = None):
        self._init_state()
        self.config = config
        device = torch.device(config.device)
        if model is None:
            if config.model_dir is None:
                raise ValueError("model_dir must be set when no model is given")
            model = load_pretrained(config.model_dir, dtype=config.torch_dtype, device=device)
        self._model = model.to(device=device, dtype=config.torch_dtype).requires_grad_(False).eval()
        mc = self._model.config
        self._cache = PagedKVCache(
            num_layers=mc.num_hidden_layers, num_kv_heads=mc.num_key_value_heads, head_dim=mc.head_dim,
            num_blocks=config.num_blocks, block_size=config.block_size, dtype=config.torch_dtype,
            device=device)
        self.exports_kv = _kv_kernels_for(device)
        self._forward = PagedForward(self._model, self._cache)
        self._sched = Scheduler(self._cache, max_batch_size=config.max_batch_size,
                                max_prefill_tokens=config.max_prefill_tokens, scatter=self._scatter)
        self.max_model_len = _max_model_len(config, mc.max_position_embeddings, self._cache.capacity_tokens)
        self._version = config.weight_version
        self._commands: list[tuple[Callable[[], object], Future]] = []
        self._steps: deque[tuple[float, float, int]] = deque()  # (end time, duration, tokens)
        self._thread = threading.Thread(target=self._run, name="rlboost-embedded-engine", daemon=True)
        self._thread.start()
        # A daemon thread still inside torch when the interpreter finalizes aborts the
        # process, so an engine left open is closed at exit (the hook holds a weak ref).
        self._close_at_exit = functools.partial(_close_if_alive, weakref.ref(self))
        atexit.register(self._close_at_exit)

    # ---- public API (any thread) -------------------------------------------------------

    @property
    def kv_layout(self):
        return self._cache.layout

    @property
    def model_config(self):
        return self._model.config

    def submit(self, states: Sequence[RequestState]) -> None:
        states = list(states)
        self._call(lambda: self._add(states, [None] * len(states)))

    def abort(self, sample_ids: Sequence[int]) -> None:
        ids = list(sample_ids)
        self._call(lambda: self._remove(ids))

    def export_states(self, sample_ids: Sequence[int] | None = None, *, with_kv: bool = False):
        ids = None if sample_ids is None else list(sample_ids)
        return self._call(lambda: self._export(ids, with_kv))

    def import_states(self, batch) -> None:
        self._call(lambda: self._import(batch))

    def load_weights(self, named_tensors: Mapping[str, object], version: int) -> None:
        self._call(lambda: self._load_weights(named_tensors, version))

    def load(self) -> EngineLoad:
        with self._cond:
            self._check_usable()
            running, queued, queued_tokens = self._counts
            busy = sum(d for _, d, _ in self._steps)
            rate = sum(n for _, _, n in self._steps) / busy if busy > 0 else 0.0
            return EngineLoad(running=running, queued=queued, queued_tokens=queued_tokens,
                              decode_tokens_per_s=rate, weight_version=self._version)

    def close(self) -> None:
        if not self._mark_closed():
            return
        if threading.current_thread() is not self._thread:
            self._thread.join()
        atexit.unregister(self._close_at_exit)
        self._cache.tensor = torch.empty(0)  # release the cache memory now

    def _call(self, fn: Callable[[], T]) -> T:
        fut: Future = Future()
        with self._cond:
            self._check_usable()
            self._commands.append((fn, fut))
            self._cond.notify_all()
        return fut.result()

    # ---- engine thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._closed or self._commands or self._sched.by_id)
                    if self._closed:
                        break
                    commands, self._commands = self._commands, []
                for fn, fut in commands:
                    try:
                        result = fn()
                    except BaseException as e:  # handed to the caller, who re-raises it
                        self._update_counts()
                        fut.set_exception(e)
                    else:
                        self._update_counts()
                        fut.set_result(result)
                if self._sched.running or self._sched.waiting:
                    self._step()
        except BaseException as e:
            with self._cond:
                self._failure = e
                self._cond.notify_all()
        finally:
            with self._cond:
                pending, self._commands = self._commands, []
            for _, fut in pending:
                fut.set_exception(RolloutError("engine closed before the call ran"))

    def _step(self) -> None:
        start = time.perf_counter()
        plan = self._sched.plan()
        if not plan:
            return
        logits = self._forward([chunk for _, chunk in plan])
        sampled, specs = [], []
        for seq, chunk in plan:
            seq.kv_len = chunk.start + len(chunk.tokens)
            if chunk.wants_logits:
                p = seq.state.params
                sampled.append(seq)
                specs.append(DrawSpec(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                      key=draw_key(seq.state.seed, seq.sample_id, len(seq.out_ids))))
        ids, logprobs = sample_tokens(logits, specs)
        for seq, token, logprob in zip(sampled, ids, logprobs):
            self._append(seq, token, logprob)
        end = time.perf_counter()
        counts = self._current_counts()
        with self._cond:
            self._counts = counts
            self._steps.append((end, end - start, len(sampled)))
            while self._steps and self._steps[0][0] < end - self.config.rate_window_s:
                self._steps.popleft()
            released = [self._emit(s) for s in sampled
                        if s.finish_reason or len(s.out_ids) - s.emitted >= self.config.stream_interval]
            if released:
                self._cond.notify_all()

    def _append(self, seq: EngineSample, token: int, logprob: float) -> None:
        seq.tokens.append(token)
        seq.out_ids.append(token)
        seq.out_logprobs.append(logprob)
        if token in seq.state.params.stop_token_ids:
            seq.finish_reason = "stop"
        elif len(seq.out_ids) >= seq.state.params.max_new_tokens or len(seq.tokens) >= self.max_model_len:
            seq.finish_reason = "length"
        if seq.finish_reason:
            self._sched.finish(seq)

    def _emit(self, seq: EngineSample) -> None:
        """Move a sample's unreleased tokens into the delta buffer (caller holds _cond)."""
        self._deltas.add(seq.sample_id, seq.emitted, tuple(seq.out_ids[seq.emitted:]),
                         tuple(seq.out_logprobs[seq.emitted:]), seq.finish_reason,
                         weight_version=self._version)
        seq.emitted = len(seq.out_ids)

    def _current_counts(self) -> tuple[int, int, int]:
        return len(self._sched.running), len(self._sched.waiting), self._sched.queued_tokens()

    def _update_counts(self) -> None:
        counts = self._current_counts()
        with self._cond:
            self._counts = counts

    def _add(self, states: list[RequestState], kv: list) -> None:
        validate_states(states, known=self._sched.by_id, version=self._version,
                        vocab_size=self._model.config.vocab_size, max_model_len=self.max_model_len)
        for state, pages in zip(states, kv):
            seq = EngineSample.from_state(state)
            seq.pending_kv = pages
            self._sched.add(seq)

    def _remove(self, ids: list[int]) -> list[EngineSample]:
        removed = [seq for seq in map(self._sched.remove, ids) if seq is not None]
        with self._cond:
            for sid in ids:  # finished samples too: their last delta may still be waiting
                self._deltas.discard(sid)
        return removed

    def _export(self, ids: list[int] | None, with_kv: bool):
        from rlboost.migration.batch import MigrationBatch
        from rlboost.migration.kv import gather_pages_batch

        if with_kv and not self.exports_kv:
            raise RolloutError("this rlboost build has no CUDA kernels to gather KV pages on "
                               f"{self.config.device} (rlboost._C.HAS_CUDA is False): export with "
                               "with_kv=False, or rebuild with RLBOOST_WITH_CUDA=ON")
        if ids is None:
            ids = [s.sample_id for s in (*self._sched.running, *self._sched.waiting)]
        seqs = [self._sched.by_id[i] for i in dict.fromkeys(ids) if i in self._sched.by_id]
        states = tuple(dataclasses.replace(
            seq.state, output_ids=tuple(seq.out_ids), output_logprobs=tuple(seq.out_logprobs),
            weight_version=self._version) for seq in seqs)
        kv = {}
        if with_kv:
            placed = [s for s in seqs if s.pending_kv is None]
            gathered = gather_pages_batch(self._cache.tensor, self._cache.layout,
                                          [s.blocks for s in placed], [s.kv_len for s in placed])
            kv = {s.sample_id: (s.kv_len, data) for s, data in zip(placed, gathered)}
            kv.update({s.sample_id: s.pending_kv for s in seqs if s.pending_kv is not None})
        self._remove([s.sample_id for s in seqs])
        if not with_kv:
            return MigrationBatch(states=states)
        return MigrationBatch(states=states, kv_layout=self._cache.layout,
                              kv_tokens=tuple(kv[s.sample_id][0] for s in seqs),
                              kv_data=tuple(kv[s.sample_id][1] for s in seqs))

    def _import(self, batch) -> None:
        pages = check_import(batch, self._cache.layout)
        if not self.exports_kv:  # no kernels to place pages on this GPU: re-prefill instead
            pages = [None] * len(pages)
        self._add(list(batch.states), pages)

    def _scatter(self, blocks: list[int], kv_tokens: int, data: torch.Tensor) -> None:
        from rlboost.migration.kv import scatter_pages

        scatter_pages(self._cache.tensor, self._cache.layout, blocks, kv_tokens,
                      data.to(self._cache.tensor.device))

    def _load_weights(self, named_tensors: Mapping[str, object], version: int) -> None:
        if self._sched.by_id:
            raise EngineBusy(f"cannot load weights while {len(self._sched.by_id)} samples are in "
                               "flight; export or abort them first")
        load_named_tensors(self._model, named_tensors, version)
        with self._cond:
            self._version = version


def _max_model_len(config: EmbeddedEngineConfig, model_max: int, capacity: int) -> int:
    """The configured max_model_len, which the KV cache must hold; by default the model's
    maximum, or the cache's capacity when that is smaller."""
    if config.max_model_len is None:
        return min(model_max, capacity)
    if config.max_model_len > capacity:
        raise ValueError(f"max_model_len {config.max_model_len} does not fit the KV cache: num_blocks "
                         f"{config.num_blocks} x block_size {config.block_size} = {capacity} tokens; "
                         "raise num_blocks or lower max_model_len")
    return config.max_model_len


def _kv_kernels_for(device: torch.device) -> bool:
    """Whether this build moves KV pages on `device`: always on CPU, on a GPU only with the
    CUDA kernels. Without them a GPU engine still runs, but its samples migrate without KV
    pages (exports_kv False: the controller then resumes them by re-prefill), and it says so
    at start rather than at its first export."""
    from rlboost import _C

    if device.type != "cuda" or _C.HAS_CUDA:
        return True
    warnings.warn(f"EmbeddedEngine on {device}: this rlboost build has no CUDA kernels "
                  "(rlboost._C.HAS_CUDA is False), so its samples migrate without their KV pages "
                  "(re-prefill). To move KV pages, reinstall with nvcc reachable (PATH, CUDA_HOME/bin "
                  "or /usr/local/cuda/bin): RLBOOST_WITH_CUDA=ON pip install .", RuntimeWarning, stacklevel=3)
    return False


def _close_if_alive(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.close()
