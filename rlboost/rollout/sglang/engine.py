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
import importlib
from typing import Any, Callable, Mapping

from rlboost.errors import RolloutError
from rlboost.migration.state import RequestState
from rlboost.rollout.server.checkpoint_facts import check_weights
from rlboost.rollout.server.engine import StreamedEngine
from rlboost.rollout.server.failures import load_failure
from rlboost.rollout.sglang.config import SGLangEngineConfig
from rlboost.rollout.sglang.requests import SGLangSample, cut_at_stop, finish_of, new_entries, request_id
from rlboost.rollout.sglang.weights import flush_when_idle, push_weights, weight_buckets

__all__ = ["SGLangEngine", "SGLangEngineConfig"]
_INSTALL_HINT = "SGLangEngine needs SGLang on a GPU machine: pip install 'rlboost[sglang]'"


class SGLangEngine(StreamedEngine):
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
    `sglang.Engine`); tests pass a stand-in with the same API. What it shares with the vLLM
    adapter (the engine thread, admission, deltas, load) is StreamedEngine's.
    """

    _failure_label = "SGLang engine"
    _engine_name = "SGLang"

    def __init__(self, config: SGLangEngineConfig, engine_factory: Callable[..., Any] | None = None):
        if config.model_path is None:
            raise ValueError("SGLangEngineConfig.model_path must name the checkpoint SGLang loads")
        factory = engine_factory or _sglang_engine_class()
        self._released = False
        self._init_streams(config, lambda: factory(**config.engine_kwargs()), "rlboost-sglang-engine")

    def release_memory(self) -> None:
        """Free SGLang's GPU memory (weights, KV cache) for a trainer sharing the GPUs; needs
        extra_engine_kwargs={"enable_memory_saver": True}. Refused while samples are admitted."""
        self._call(lambda: self._set_memory(release=True))

    def resume_memory(self) -> None:
        """Take the memory back. Load weights afterwards unless SGLang kept a CPU copy of them."""
        self._call(lambda: self._set_memory(release=False))

    # ---- engine thread: calls between loop turns ----------------------------------------

    def _check_admission(self) -> None:
        if self._released:
            raise RolloutError("SGLang's memory is released: call resume_memory() first")

    def _prepare(self, state: RequestState) -> tuple[SGLangSample, None]:
        return SGLangSample(state=state, rid=""), None

    def _new_request_id(self, serial: int, sample_id: int) -> str:
        return request_id(self._rid_prefix, serial, sample_id)

    def _load_weights(self, named: Mapping[str, object], version: int) -> None:
        self._check_loadable(version)
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
            failure = load_failure(self._engine_name, version, e, self._cause(e))
            self._fail(failure)
            raise failure from e
        self._loaded(version)

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

    def _start(self, sample: SGLangSample, prepared: None = None) -> None:
        self._spawn(self._consume(sample, sample.rid))

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
        self._take(sample, pairs)
        if finish is None:
            finish = finish_of(sample, reason)
        elif reason is None:  # finished here before SGLang noticed
            self._abort_request(sample.rid)
        if finish == "continue":
            sample.rid, sample.segment_start = self._new_rid(sample.sample_id), len(sample.ids)
            self._start(sample)
            finish = None
        self._settle(sample, finish, len(pairs))

    def _abort_request(self, rid: str) -> None:
        # Engine has no abort call: its TokenizerManager has, and ignores a rid it has not
        # registered yet (see _consume); the scheduler aborts by rid prefix (request_id).
        self._engine.tokenizer_manager.abort_request(rid=rid)


def _sglang_engine_class() -> Callable[..., Any]:
    try:
        return importlib.import_module("sglang").Engine
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
