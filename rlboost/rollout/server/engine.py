"""StreamedEngine: what the adapters of engines that run in processes of their own (SGLang,
vLLM) share: one LoopThread that builds and owns the engine and runs its event loop, the
RolloutEngine calls made between loop turns on that thread, the samples admitted and their
load, and token deltas handed out with the newest token held back until the finish.

A subclass says how its engine is asked: _prepare (a state as a sample, checked whole before
any is admitted), _start (one request for a sample, as a task on the loop), _abort_request,
and load_weights; it reads the streams and calls _emit.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import functools
import uuid
import weakref
from typing import Any, Callable, Mapping, Sequence, TypeVar

from rlboost.errors import EngineBusy, EngineFailed, RolloutError
from rlboost.migration.batch import MigrationBatch
from rlboost.migration.state import RequestState
from rlboost.rollout.admission import validate_states
from rlboost.rollout.engine import EngineLoad
from rlboost.rollout.server.checkpoint_facts import CheckpointFacts, read_checkpoint_facts
from rlboost.rollout.server.failures import again, describe, start_failure
from rlboost.rollout.server.loop_thread import LoopThread
from rlboost.rollout.server.rate import DecodeRate, LoadCounts
from rlboost.rollout.server.sample import StreamedSample
from rlboost.rollout.threaded import ThreadedEngineState

T = TypeVar("T")


class StreamedEngine(ThreadedEngineState, metaclass=abc.ABCMeta):
    """Base of SGLangEngine and VLLMEngine. Subclasses set _engine_name and implement
    _prepare, _start, _abort_request, _new_request_id and _load_weights."""

    exports_kv = False
    batch_invariant = False
    _engine_name = "the engine"

    def _init_streams(self, config: Any, build: Callable[[], Any], thread_name: str) -> None:
        """Everything but the engine, then the engine on its own thread (config: the
        adapter's config, with model_path, vocab_size, max_model_len, weight_version and
        rate_window_s)."""
        if config.model_path is None:
            raise ValueError(f"{type(config).__name__}.model_path must name the checkpoint {self._engine_name} loads")
        self._init_state()
        self.config = config
        self._facts: CheckpointFacts = read_checkpoint_facts(config.model_path)
        self.vocab_size = config.vocab_size or self._facts.vocab_size
        if self.vocab_size is None:
            raise ValueError(f"vocab_size must be set: {config.model_path}/config.json does not give it")
        self.max_model_len = config.max_model_len or self._facts.max_position_embeddings
        self._version = config.weight_version
        self._rid_prefix = f"rlboost-{uuid.uuid4().hex[:8]}"
        self._rids = 0
        self._rate = 0.0
        # Engine thread only:
        self._samples: dict[int, StreamedSample] = {}
        self._load_counts = LoadCounts()  # _samples summed up
        self._tasks: set[asyncio.Task] = set()
        self._decode_rate = DecodeRate(config.rate_window_s)
        self._shutdown_error: BaseException | None = None
        try:
            self._thread = LoopThread(build, name=thread_name)
        except Exception as e:
            raise start_failure(self._engine_name, e, self._cause(e)) from e
        self._engine, self._loop = self._thread.owned, self._thread.loop
        # A daemon thread still inside the engine when the interpreter finalizes may abort the
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
            raise RolloutError(f"{self._engine_name} keeps KV pages inside its own processes (its public API "
                               "cannot export them): export with with_kv=False and resume by re-prefill")
        ids = None if sample_ids is None else list(sample_ids)
        return self._call(lambda: self._export(ids))

    def import_states(self, batch) -> None:
        """Resume a batch by re-prefill; KV pages in it are not used (the engine cannot take them)."""
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
            raise RolloutError(f"{self._engine_name} did not shut down cleanly: {e!r}") from e

    def _check_usable(self) -> None:
        if isinstance(self._failure, EngineFailed):  # the engine's own words, on every later call
            raise again(self._failure) from self._failure
        super()._check_usable()

    def _cause(self, e: BaseException) -> str:
        """The engine's own account of a failure, one line (subclasses read their engine's
        log when the exception only points to it)."""
        return describe(e)

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

    def _check_admission(self) -> None:
        """Refuse new samples for a reason of the subclass's (RolloutError)."""

    @abc.abstractmethod
    def _prepare(self, state: RequestState) -> tuple[StreamedSample, Any]:
        """The sample for a state (rid set later) and what _start needs; RolloutError refuses
        the whole batch before anything is admitted."""

    @abc.abstractmethod
    def _start(self, sample: StreamedSample, prepared: Any) -> None:
        """Submit a prepared sample's request to the engine, from the engine thread."""

    @abc.abstractmethod
    def _abort_request(self, rid: str) -> None:
        """Ask the engine to stop request rid (its tokens so far stay the sample's)."""

    @abc.abstractmethod
    def _new_request_id(self, serial: int, sample_id: int) -> str:
        """The engine's request id for a sample's serial-th request."""

    @abc.abstractmethod
    def _load_weights(self, named: Mapping[str, object], version: int) -> None:
        """Put a pulled version's named tensors into the engine's model."""

    def _add(self, states: list[RequestState]) -> None:
        self._check_admission()
        validate_states(states, known=self._samples, version=self._version, vocab_size=self.vocab_size,
                        max_model_len=self.max_model_len)
        prepared = [self._prepare(state) for state in states]
        if prepared:
            self._decode_rate.busy()
        for sample, extra in prepared:
            sample.rid = self._new_rid(sample.sample_id)
            self._samples[sample.sample_id] = sample
            self._account(sample, +1)
            self._start(sample, extra)

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

    def _check_loadable(self, version: int) -> None:
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise RolloutError(f"version must be a non-negative int, got {version!r}")
        if self._samples:
            raise EngineBusy(f"cannot load weights while {len(self._samples)} samples are in "
                               "flight; export or abort them first")

    def _loaded(self, version: int) -> None:
        with self._cond:
            self._version = version

    # ---- engine thread: streams ---------------------------------------------------------

    def _new_rid(self, sample_id: int) -> str:
        self._rids += 1  # engines refuse a request id they still track: every request gets its own
        return self._new_request_id(self._rids, sample_id)

    def _sleep(self, seconds: float) -> None:
        """Wait on the engine thread while the engine's loop runs (streams drain meanwhile)."""
        self._loop.run_until_complete(asyncio.sleep(seconds))

    def _spawn(self, coro) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wanted(self, sample: StreamedSample, rid: str) -> bool:
        return self._samples.get(sample.sample_id) is sample and sample.rid == rid

    def _take(self, sample: StreamedSample, pairs: list[tuple[int, float]]) -> None:
        """Add a sample's new (token, logprob) pairs, its load moved along with them."""
        self._account(sample, -1)
        sample.ids += [t for t, _ in pairs]
        sample.logprobs += [lp for _, lp in pairs]

    def _settle(self, sample: StreamedSample, finish: str | None, arrived: int) -> None:
        """After a read: the sample counts again (running) or leaves (finished), the tokens
        are counted for the rate, and what can go out goes out."""
        if finish is None:
            self._account(sample, +1)
        else:
            del self._samples[sample.sample_id]
        self._record_arrival(arrived)
        self._emit(sample, finish)
        self._publish_counts()
        self._note_idle()

    def _emit(self, sample: StreamedSample, finish: str | None) -> None:
        # While the sample runs its newest token is held back, so that its finish (which the
        # engine may report in an answer without new tokens) always travels with a token.
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

    def _record_arrival(self, n: int) -> None:
        rate = self._decode_rate.add(n)
        with self._cond:
            self._rate = rate

    def _note_idle(self) -> None:
        if not self._samples:  # the next busy period is measured on its own
            self._decode_rate.idle()

    def _account(self, sample: StreamedSample, sign: int) -> None:
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
        """Stop the streams and shut the engine down (on the engine thread, last); its
        shutdown ends its processes, and with them every request still running."""
        self._samples.clear()
        try:
            _cancel(self._loop, self._tasks)
            self._engine.shutdown()
            _cancel(self._loop, asyncio.all_tasks(self._loop))  # the engine's own, now without peers
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


def _close_if_alive(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.close()
