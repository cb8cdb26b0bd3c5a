"""VLLMEngine: the RolloutEngine protocol over vLLM's `AsyncLLM`, so GPU instances roll out
with vLLM and the controller drives them like the other engines.

One background thread (the LoopThread the SGLang adapter uses) builds and owns the AsyncLLM:
it runs the event loop where one task per vLLM request consumes its output stream, and runs
each public call between two loop turns, where the adapter drives vLLM's coroutines (abort,
collective_rpc, reset_prefix_cache) to completion. Deltas wait in a buffer that poll()
drains under a condition variable.

Supported vLLM: 0.20 to 0.33 (the `vllm` extra pins that range; tests/rollout/fake_vllm.py
plays each release line's rules, tests/rollout/test_vllm_conformance.py checks the adapter
against the installed release). Weights go through vLLM's public extension points: a worker
extension (worker.py) that vLLM mixes into its workers and `collective_rpc` (weights.py).
A sample that loses its instance resumes elsewhere by re-prefill of prompt + output.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

from rlboost.errors import RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.state import RequestState
from rlboost.rollout.admission import validate_states
from rlboost.rollout.engine import EngineLoad
from rlboost.rollout.sglang.rate import DecodeRate, LoadCounts
from rlboost.rollout.sglang.thread import LoopThread
from rlboost.rollout.sglang.weights import check_weights, read_checkpoint_facts
from rlboost.rollout.streamed import cut_at_stop
from rlboost.rollout.threaded import ThreadedEngineState
from rlboost.rollout.vllm.config import VLLMEngineConfig
from rlboost.rollout.vllm.requests import VLLMSample, finish_of, new_pairs, request_id
from rlboost.rollout.vllm.weights import LOAD_CALL, check_loaded, reset_when_idle, shared_bucket

__all__ = ["VLLMApi", "VLLMEngine", "VLLMEngineConfig"]
T = TypeVar("T")
_INSTALL_HINT = "VLLMEngine needs vLLM on a GPU machine: pip install 'rlboost[vllm]'"


@dataclass(frozen=True, slots=True)
class VLLMApi:
    """The vLLM classes the adapter uses (tests pass a stand-in's)."""

    AsyncLLM: Any
    AsyncEngineArgs: Any
    SamplingParams: Any
    RequestOutputKind: Any


def installed_vllm() -> VLLMApi:
    try:
        vllm = importlib.import_module("vllm")
        sampling = importlib.import_module("vllm.sampling_params")
        async_llm = importlib.import_module("vllm.v1.engine.async_llm")
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    return VLLMApi(AsyncLLM=async_llm.AsyncLLM, AsyncEngineArgs=vllm.AsyncEngineArgs,
                   SamplingParams=sampling.SamplingParams, RequestOutputKind=sampling.RequestOutputKind)


class VLLMEngine(ThreadedEngineState):
    """The vLLM rollout engine. Usage (on a GPU machine with vLLM installed):

        engine = VLLMEngine(VLLMEngineConfig(model_path="ckpt/", stream_interval=8))
        engine.submit([RequestState(sample_id=1, prompt_ids=(1, 2, 3), seed=0, weight_version=0,
                                    params=SamplingParams(max_new_tokens=64, stop_token_ids=(2,)))])
        deltas = engine.poll(1.0)   # [TokenDelta(sample_id=1, start=0, ids=(...), ...)]
        engine.close()

    Each sample is one vLLM request at a time, re-prefilled from prompt + output. Resumed
    samples may differ from an uninterrupted run (vLLM's kernels are not batch-invariant and
    its per-request generator restarts: `batch_invariant = False`), and KV pages stay inside
    vLLM (`exports_kv = False`: migration is tokens-only).
    """

    exports_kv = False
    batch_invariant = False
    _failure_label = "vLLM engine"

    def __init__(self, config: VLLMEngineConfig, api: VLLMApi | None = None):
        if config.model_path is None:
            raise ValueError("VLLMEngineConfig.model_path must name the checkpoint vLLM loads")
        self.api = api or installed_vllm()
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
        self._samples: dict[int, VLLMSample] = {}
        self._load_counts = LoadCounts()
        self._tasks: set[asyncio.Task] = set()
        self._decode_rate = DecodeRate(config.rate_window_s)
        self._shutdown_error: BaseException | None = None
        try:
            self._thread = LoopThread(self._build, name="rlboost-vllm-engine")
        except Exception as e:
            raise RolloutError(f"vLLM engine did not start: {e!r}") from e
        self._engine, self._loop = self._thread.owned, self._thread.loop
        self._close_at_exit = functools.partial(_close_if_alive, weakref.ref(self))
        atexit.register(self._close_at_exit)

    def _build(self) -> Any:
        return self.api.AsyncLLM.from_engine_args(self.api.AsyncEngineArgs(**self.config.engine_kwargs()))

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
            raise RolloutError("vLLM keeps KV pages inside its workers (its public API cannot export "
                               "them): export with with_kv=False and resume by re-prefill")
        ids = None if sample_ids is None else list(sample_ids)
        return self._call(lambda: self._export(ids))

    def import_states(self, batch) -> None:
        """Resume a batch by re-prefill; KV pages in it are not used (vLLM cannot take them)."""
        if not isinstance(batch, MigrationBatch):
            raise RolloutError(f"expected MigrationBatch, got {type(batch).__name__}")
        states = list(batch.states)
        self._call(lambda: self._add(states))

    def load_weights(self, named_tensors: Mapping[str, object], version: int) -> None:
        self._call(lambda: self._load_weights(named_tensors, version))

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
            raise RolloutError(f"vLLM did not shut down cleanly: {e!r}") from e

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

    def _run(self, coro) -> Any:
        """Drive one of vLLM's coroutines to its end (between loop turns: streams run meanwhile)."""
        return self._loop.run_until_complete(coro)

    def _add(self, states: list[RequestState]) -> None:
        validate_states(states, known=self._samples, version=self._version, vocab_size=self.vocab_size,
                        max_model_len=self.max_model_len)
        admitted = []
        for state in states:  # vLLM's own checks of every request first: the batch is refused whole
            sample = VLLMSample(state=state, rid="")
            try:
                params = self.api.SamplingParams(**sample.sampling_kwargs(
                    seeded=self.config.seeded, delta_kind=self.api.RequestOutputKind.DELTA))
            except (ValueError, TypeError) as e:
                raise RolloutError(f"vLLM refuses sample {state.sample_id}'s sampling parameters: {e}") from e
            admitted.append((sample, params))
        if admitted:
            self._decode_rate.busy()
        for sample, params in admitted:
            sample.rid = self._new_rid(sample.sample_id)
            self._samples[sample.sample_id] = sample
            self._account(sample, +1)
            self._start(sample, params)

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
        pairs = check_weights(self._facts, named)
        try:
            for group in _groups(pairs, self.config.weight_bucket_bytes):
                with shared_bucket(group, self.config.dtype) as bucket:
                    answers = self._run(self._engine.collective_rpc(LOAD_CALL, args=(bucket.path, list(bucket.entries))))
                    check_loaded(answers, bucket, self.config.tp_size)
            # requests aborted a moment ago may still hold KV blocks: retried until vLLM lets go
            reset_when_idle(lambda: self._run(self._engine.reset_prefix_cache()), self._sleep,
                            self.config.flush_timeout_s)
        except BaseException as e:
            # Some tensors may already be replaced: this engine's weights are unknown now.
            self._fail(e)
            raise RolloutError(f"vLLM failed to load weights version {version}: {e!r}") from e
        with self._cond:
            self._version = version

    # ---- engine thread: streams ---------------------------------------------------------

    def _new_rid(self, sample_id: int) -> str:
        self._rids += 1
        return request_id(self._rid_prefix, self._rids, sample_id)

    def _sleep(self, seconds: float) -> None:
        self._loop.run_until_complete(asyncio.sleep(seconds))

    def _spawn(self, coro) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start(self, sample: VLLMSample, params: Any) -> None:
        self._spawn(self._consume(sample, sample.rid, params))

    def _wanted(self, sample: VLLMSample, rid: str) -> bool:
        return self._samples.get(sample.sample_id) is sample and sample.rid == rid

    async def _consume(self, sample: VLLMSample, rid: str, params: Any) -> None:
        if not self._wanted(sample, rid):  # dropped before its request was sent
            return
        try:
            async for output in self._engine.generate(sample.prompt(), params, rid):
                if self._wanted(sample, rid):
                    self._absorb(sample, output)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never swallowed: the caller sees it on its next call
            if self._wanted(sample, rid):
                self._fail(e)

    def _absorb(self, sample: VLLMSample, output: Any) -> None:
        pairs, reason = new_pairs(sample, output)
        pairs, finish = cut_at_stop(sample, pairs)
        self._account(sample, -1)
        sample.ids += [t for t, _ in pairs]
        sample.logprobs += [lp for _, lp in pairs]
        if finish is None:
            finish = finish_of(sample, reason)
        elif reason is None:  # finished here before vLLM noticed
            self._abort_request(sample.rid)
        if finish is None:
            self._account(sample, +1)
        else:
            del self._samples[sample.sample_id]
        self._record_arrival(len(pairs))
        self._emit(sample, finish)
        self._publish_counts()
        self._note_idle()

    def _emit(self, sample: VLLMSample, finish: str | None) -> None:
        # While the sample runs its newest token is held back, so that its finish (which vLLM
        # may report in an output without new tokens) always travels with a token.
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
        self._spawn(self._engine.abort(rid))  # runs at the loop's next turn

    def _record_arrival(self, n: int) -> None:
        rate = self._decode_rate.add(n)
        with self._cond:
            self._rate = rate

    def _note_idle(self) -> None:
        if not self._samples:
            self._decode_rate.idle()

    def _account(self, sample: VLLMSample, sign: int) -> None:
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
        """Stop the streams and shut vLLM down (on the engine thread, last)."""
        self._samples.clear()
        try:
            _cancel(self._loop, self._tasks)
            self._engine.shutdown()
            _cancel(self._loop, asyncio.all_tasks(self._loop))
        except BaseException as e:
            self._shutdown_error = e
        finally:
            self._loop.close()


def _groups(pairs: list[tuple[str, Any]], bucket_bytes: int):
    """Consecutive groups of about bucket_bytes (a larger tensor goes alone)."""
    group, size = [], 0
    for name, t in pairs:
        nbytes = t.numel() * t.element_size()
        if group and size + nbytes > bucket_bytes:
            yield group
            group, size = [], 0
        group.append((name, t))
        size += nbytes
    if group:
        yield group


def _cancel(loop: asyncio.AbstractEventLoop, tasks) -> None:
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _close_if_alive(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.close()
