"""SGLangEngine: the RolloutEngine protocol over SGLang's offline `Engine`, so GPU instances
roll out with SGLang and the controller drives them like the embedded engine.

One background thread (LoopThread) builds and owns the `sglang.Engine`: it runs the engine's
event loop, where one task per SGLang request consumes its token stream, and runs each public
call between two loop turns, when SGLang's synchronous methods (update_weights_from_tensor,
flush_cache, ...) may drive that loop. Deltas wait in a buffer that poll() drains under a
condition variable.

Supported SGLang: 0.5.9 to 0.5.23 (the `sglang` extra pins that range). What differs between
them is detected, not read from a version string: from 0.5.21 weight updates run inside
begin_weight_update()/end_weight_update() (weights.push_weights). Every release refuses
flush_cache while its scheduler is busy, so the flush after a weight load is retried until
idle, within config.flush_timeout_s. Engine has no pause or abort call in any of them: aborts
go through its TokenizerManager by rid, and as the scheduler matches rids by prefix, no rid
the adapter issues is a prefix of another (requests.request_id).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib
import uuid
import weakref
from typing import Any, Callable, Mapping, Sequence, TypeVar

from rlboost.errors import RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.state import RequestState
from rlboost.rollout.admission import validate_states
from rlboost.rollout.engine import EngineLoad
from rlboost.rollout.sglang.config import SGLangEngineConfig
from rlboost.rollout.sglang.rate import DecodeRate, LoadCounts
from rlboost.rollout.sglang.requests import SGLangSample, cut_at_stop, finish_of, new_entries, request_id
from rlboost.rollout.sglang.thread import LoopThread
from rlboost.rollout.sglang.weights import (
    check_weights,
    flush_when_idle,
    push_weights,
    read_checkpoint_facts,
    weight_buckets,
)
from rlboost.rollout.threaded import ThreadedEngineState

__all__ = ["SGLangEngine", "SGLangEngineConfig"]
T = TypeVar("T")
_INSTALL_HINT = "SGLangEngine needs SGLang on a GPU machine: pip install 'rlboost[sglang]'"


class SGLangEngine(ThreadedEngineState):
    """The SGLang rollout engine. Usage (on a GPU machine with SGLang installed):

        engine = SGLangEngine(SGLangEngineConfig(model_path="ckpt/", stream_interval=8))
        engine.submit([RequestState(sample_id=1, prompt_ids=(1, 2, 3), seed=0, weight_version=0,
                                    params=SamplingParams(max_new_tokens=64, stop_token_ids=(2,)))])
        deltas = engine.poll(1.0)   # [TokenDelta(sample_id=1, start=0, ids=(...), ...)]
        engine.close()

    Each sample is one SGLang request at a time, re-prefilled from prompt + output, with a
    per-request sampling_seed (requests.py says how). Resumed samples may differ from an
    uninterrupted run (SGLang's kernels are not batch-invariant: `batch_invariant = False`),
    and KV pages stay inside SGLang (`exports_kv = False`: migration is tokens-only).
    `engine_factory(**config.engine_kwargs())` builds the SGLang engine (default
    `sglang.Engine`); tests pass a stand-in with the same API.
    """

    exports_kv = False
    batch_invariant = False
    _failure_label = "SGLang engine"

    def __init__(self, config: SGLangEngineConfig, engine_factory: Callable[..., Any] | None = None):
        if config.model_path is None:
            raise ValueError("SGLangEngineConfig.model_path must name the checkpoint SGLang loads")
        factory = engine_factory or _sglang_engine_class()
        self._init_state()
        self.config = config
        self._facts = read_checkpoint_facts(config.model_path)
        self.vocab_size = config.vocab_size or self._facts.vocab_size
        if self.vocab_size is None:
            raise ValueError(f"vocab_size must be set: {config.model_path}/config.json does not give it")
        self.max_model_len = config.max_model_len or self._facts.max_position_embeddings
        self._version = config.weight_version
        self._rid_prefix = f"rlboost-{uuid.uuid4().hex[:8]}"
        self._rids = 0
        self._rate = 0.0
        # Engine thread only:
        self._samples: dict[int, SGLangSample] = {}
        self._load_counts = LoadCounts()  # _samples summed up
        self._tasks: set[asyncio.Task] = set()
        self._decode_rate = DecodeRate(config.rate_window_s)
        self._released = False
        self._shutdown_error: BaseException | None = None
        try:
            self._thread = LoopThread(lambda: factory(**config.engine_kwargs()), name="rlboost-sglang-engine")
        except Exception as e:
            raise RolloutError(f"SGLang engine did not start: {e!r}") from e
        self._engine, self._loop = self._thread.owned, self._thread.loop
        # A daemon thread still inside SGLang when the interpreter finalizes may abort the
        # process, so an engine left open is closed at exit (the hook holds a weak ref).
        self._close_at_exit = functools.partial(_close_if_alive, weakref.ref(self))
        atexit.register(self._close_at_exit)

    # ---- public API (any thread) -------------------------------------------------------

    def submit(self, states: Sequence[RequestState]) -> None:
        states = list(states)
        self._call(lambda: self._add(states))

    def abort(self, sample_ids: Sequence[int]) -> None:
        ids = list(sample_ids)
        self._call(lambda: self._drop(ids))

    def export_states(self, sample_ids: Sequence[int] | None = None, *, with_kv: bool = False):
        if with_kv:
            with self._cond:
                self._check_usable()
            raise RolloutError("SGLang keeps KV pages inside its scheduler (its public API cannot "
                               "export them): export with with_kv=False and resume by re-prefill")
        ids = None if sample_ids is None else list(sample_ids)
        return self._call(lambda: self._export(ids))

    def import_states(self, batch) -> None:
        """Resume a batch by re-prefill; KV pages in it are not used (SGLang cannot take them)."""
        if not isinstance(batch, MigrationBatch):
            raise RolloutError(f"expected MigrationBatch, got {type(batch).__name__}")
        states = list(batch.states)
        self._call(lambda: self._add(states))

    def load_weights(self, named_tensors: Mapping[str, object], version: int) -> None:
        self._call(lambda: self._load_weights(named_tensors, version))

    def release_memory(self) -> None:
        """Free SGLang's GPU memory (weights, KV cache) for a trainer sharing the GPUs; needs
        extra_engine_kwargs={"enable_memory_saver": True}. Refused while samples are admitted."""
        self._call(lambda: self._set_memory(release=True))

    def resume_memory(self) -> None:
        """Take the memory back. Load weights afterwards unless SGLang kept a CPU copy of them."""
        self._call(lambda: self._set_memory(release=False))

    def load(self) -> EngineLoad:
        with self._cond:
            self._check_usable()
            running, queued, queued_tokens = self._counts
            return EngineLoad(running=running, queued=queued, queued_tokens=queued_tokens,
                              decode_tokens_per_s=self._rate, weight_version=self._version)

    def close(self) -> None:
        if not self._mark_closed():
            return
        self._thread.stop(self._shutdown)
        atexit.unregister(self._close_at_exit)
        if self._shutdown_error is not None:
            e = self._shutdown_error
            raise RolloutError(f"SGLang did not shut down cleanly: {e!r}") from e

    def _call(self, fn: Callable[[], T]) -> T:
        with self._cond:
            self._check_usable()
        return self._thread.call(functools.partial(self._counted, fn))

    # ---- engine thread: calls between loop turns ----------------------------------------

    def _counted(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        finally:
            self._publish_counts()

    def _add(self, states: list[RequestState]) -> None:
        if self._released:
            raise RolloutError("SGLang's memory is released: call resume_memory() first")
        validate_states(states, known=self._samples, version=self._version, vocab_size=self.vocab_size,
                        max_model_len=self.max_model_len)
        if states:
            self._decode_rate.busy()
        for state in states:
            sample = SGLangSample(state=state, rid=self._new_rid(state.sample_id))
            self._samples[state.sample_id] = sample
            self._account(sample, +1)
            self._start(sample)

    def _drop(self, ids: list[int]) -> None:
        for sid in ids:
            sample = self._samples.pop(sid, None)
            if sample is not None:
                self._account(sample, -1)
                self._abort_request(sample.rid)
        with self._cond:
            for sid in ids:  # finished samples too: their last delta may still be waiting
                self._deltas.discard(sid)
        self._note_idle()

    def _export(self, ids: list[int] | None) -> MigrationBatch:
        if ids is None:
            ids = list(self._samples)
        live = [i for i in dict.fromkeys(ids) if i in self._samples]
        states = tuple(self._samples[i].current() for i in live)
        self._drop(live)
        return MigrationBatch(states=states)

    def _load_weights(self, named: Mapping[str, object], version: int) -> None:
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise RolloutError(f"version must be a non-negative int, got {version!r}")
        if self._samples:
            raise RolloutError(f"cannot load weights while {len(self._samples)} samples are in "
                               "flight; export or abort them first")
        if self._released:
            raise RolloutError("SGLang's memory is released: call resume_memory() first")
        pairs = check_weights(self._facts, named)
        # No sample is admitted, but requests aborted a moment ago may still drain inside
        # SGLang: its update waits for their streams to end (model_update_lock), and the
        # flush that drops prefix KV computed with the old weights is retried until idle.
        try:
            push_weights(self._engine, weight_buckets(pairs, self.config.weight_bucket_bytes, self.config.dtype))
            flush_when_idle(self._engine, self._sleep, self.config.flush_timeout_s)
        except BaseException as e:
            # Some tensors may already be replaced: this engine's weights are unknown now.
            self._fail(e)
            raise RolloutError(f"SGLang failed to load weights version {version}: {e!r}") from e
        with self._cond:
            self._version = version

    def _set_memory(self, *, release: bool) -> None:
        if self._samples:
            raise RolloutError(f"cannot move SGLang's memory while {len(self._samples)} samples are in flight")
        if release and not self._released:
            # SGLang's scheduler asserts it is idle here (and dies if not), so wait for the
            # requests aborted a moment ago to drain: a flush it accepts means it is idle.
            flush_when_idle(self._engine, self._sleep, self.config.flush_timeout_s)
            self._engine.release_memory_occupation()
        elif not release and self._released:
            self._engine.resume_memory_occupation()
        self._released = release

    # ---- engine thread: streams ---------------------------------------------------------

    def _new_rid(self, sample_id: int) -> str:
        self._rids += 1  # SGLang refuses a rid it still tracks, so every request gets its own
        return request_id(self._rid_prefix, self._rids, sample_id)

    def _sleep(self, seconds: float) -> None:
        """Wait on the engine thread while SGLang's loop runs (streams drain meanwhile)."""
        self._loop.run_until_complete(asyncio.sleep(seconds))

    def _start(self, sample: SGLangSample) -> None:
        task = self._loop.create_task(self._consume(sample, sample.rid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wanted(self, sample: SGLangSample, rid: str) -> bool:
        return self._samples.get(sample.sample_id) is sample and sample.rid == rid

    async def _consume(self, sample: SGLangSample, rid: str) -> None:
        if not self._wanted(sample, rid):  # dropped before its request was sent
            return
        try:
            kwargs = sample.generate_kwargs(seeded=self.config.deterministic_inference)
            stream = await self._engine.async_generate(**kwargs)
            async for chunk in stream:
                if self._wanted(sample, rid):
                    self._absorb(sample, chunk)
                else:  # dropped: SGLang ignores an abort for a request it has not registered yet
                    self._abort_request(rid)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never swallowed: the caller sees it on its next call
            if self._wanted(sample, rid):
                self._fail(e)

    def _absorb(self, sample: SGLangSample, chunk: dict) -> None:
        meta = chunk["meta_info"]
        reason = meta.get("finish_reason")
        pairs, finish = cut_at_stop(sample, new_entries(sample, meta))
        self._account(sample, -1)
        sample.ids += [t for t, _ in pairs]
        sample.logprobs += [lp for _, lp in pairs]
        if finish is None:
            finish = finish_of(sample, reason)
        elif reason is None:  # finished here before SGLang noticed
            self._abort_request(sample.rid)
        if finish == "continue":
            sample.rid, sample.segment_start = self._new_rid(sample.sample_id), len(sample.ids)
            self._start(sample)
            finish = None
        if finish is None:
            self._account(sample, +1)
        else:
            del self._samples[sample.sample_id]
        self._record_arrival(len(pairs))
        self._emit(sample, finish)
        self._publish_counts()
        self._note_idle()

    def _emit(self, sample: SGLangSample, finish: str | None) -> None:
        # While the sample runs its newest token is held back, so that its finish (which
        # SGLang may report in a chunk without new tokens) always travels with a token.
        upto = len(sample.ids) if finish else len(sample.ids) - 1
        if upto <= sample.emitted:
            return
        base = len(sample.state.output_ids)
        ids, lps = tuple(sample.ids[sample.emitted:upto]), tuple(sample.logprobs[sample.emitted:upto])
        with self._cond:
            self._deltas.add(sample.sample_id, base + sample.emitted, ids, lps, finish,
                             weight_version=self._version)
            self._cond.notify_all()
        sample.emitted = upto

    def _abort_request(self, rid: str) -> None:
        # Engine has no abort call: its TokenizerManager has, and ignores a rid it has not
        # registered yet (see _consume); the scheduler aborts by rid prefix (request_id).
        self._engine.tokenizer_manager.abort_request(rid=rid)

    def _record_arrival(self, n: int) -> None:
        rate = self._decode_rate.add(n)
        with self._cond:
            self._rate = rate

    def _note_idle(self) -> None:
        if not self._samples:  # the next busy period is measured on its own
            self._decode_rate.idle()

    def _account(self, sample: SGLangSample, sign: int) -> None:
        self._load_counts.add(bool(sample.ids), sample.remaining, sign)

    def _publish_counts(self) -> None:
        with self._cond:
            self._counts = self._load_counts.snapshot()

    def _fail(self, e: BaseException) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = e
            self._cond.notify_all()

    def _shutdown(self) -> None:
        """Stop the streams and shut SGLang down (on the engine thread, last); SGLang's
        shutdown ends its processes, and with them every request still running."""
        self._samples.clear()
        try:
            _cancel(self._loop, self._tasks)
            self._engine.shutdown()
            _cancel(self._loop, asyncio.all_tasks(self._loop))  # SGLang's own, now without peers
        except BaseException as e:
            self._shutdown_error = e
        finally:
            self._loop.close()


def _cancel(loop: asyncio.AbstractEventLoop, tasks) -> None:
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _sglang_engine_class() -> Callable[..., Any]:
    try:
        return importlib.import_module("sglang").Engine
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e


def _close_if_alive(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.close()
