"""VLLMEngine: the RolloutEngine protocol over vLLM's `AsyncLLM`, so instances roll out with
vLLM (on GPUs, or on CPU with a CPU build of vLLM) and the controller drives them like the
other engines.

One background thread (StreamedEngine's, as the SGLang adapter's) builds and owns the AsyncLLM:
it runs the event loop where one task per vLLM request consumes its output stream, and runs
each public call between two loop turns, where the adapter drives vLLM's coroutines (abort,
collective_rpc, reset_prefix_cache) to completion. Deltas wait in a buffer that poll()
drains under a condition variable.

Supported vLLM: 0.20 to 0.33 (the `vllm` extra pins that range; tests/rollout/fake_vllm.py
plays each release line's rules, tests/rollout/test_vllm_conformance.py checks the adapter
against the installed release). Weights go through vLLM's public extension points: a worker
extension (worker.py) that vLLM mixes into its workers and `collective_rpc` (weights.py), in
buckets of whole decoder layers. A failed start or load raises EngineStartFailed /
WeightLoadFailed in vLLM's own words (logs.py). A sample that loses its instance resumes
elsewhere by re-prefill of prompt + output.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from rlboost.errors import RolloutError
from rlboost.migration.state import RequestState
from rlboost.models.buckets import buckets, decoder_layer
from rlboost.rollout.server.checkpoint_facts import check_weights
from rlboost.rollout.server.engine import StreamedEngine
from rlboost.rollout.server.failures import describe, load_failure, points_elsewhere, run_failure
from rlboost.rollout.server.sample import cut_at_stop
from rlboost.rollout.vllm.api import VLLMApi, check_device, check_head_size, environment, installed_vllm
from rlboost.rollout.vllm.config import VLLMEngineConfig
from rlboost.rollout.vllm.logs import ErrorLog
from rlboost.rollout.vllm.requests import VLLMSample, finish_of, new_pairs, request_id
from rlboost.rollout.vllm.weights import LOAD_CALL, check_loaded, reset_when_idle, shared_bucket

__all__ = ["VLLMApi", "VLLMEngine", "VLLMEngineConfig"]


class VLLMEngine(StreamedEngine):
    """The vLLM rollout engine. Usage (where vLLM is installed; device="cpu" for its CPU build):

        engine = VLLMEngine(VLLMEngineConfig(model_path="ckpt/", stream_interval=8))
        engine.submit([RequestState(sample_id=1, prompt_ids=(1, 2, 3), seed=0, weight_version=0,
                                    params=SamplingParams(max_new_tokens=64, stop_token_ids=(2,)))])
        deltas = engine.poll(1.0)   # [TokenDelta(sample_id=1, start=0, ids=(...), ...)]
        engine.close()

    Each sample is one vLLM request at a time, re-prefilled from prompt + output. Resumed
    samples may differ from an uninterrupted run (vLLM's kernels are not batch-invariant and
    its per-request generator restarts: `batch_invariant = False`), and KV pages stay inside
    vLLM (`exports_kv = False`: migration is tokens-only). `api` holds the vLLM classes
    (default: the installed package's); tests pass a stand-in's.
    """

    _failure_label = "vLLM engine"
    _engine_name = "vLLM"

    def __init__(self, config: VLLMEngineConfig, api: VLLMApi | None = None):
        if config.model_path is None:
            raise ValueError("VLLMEngineConfig.model_path must name the checkpoint vLLM loads")
        self.api = api or installed_vllm()
        self._log = ErrorLog(self.api.logging_config) if self.api.logging_config else None
        try:
            self._init_streams(config, self._build, "rlboost-vllm-engine")
        except BaseException:
            self._close_log()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._close_log()

    def _build(self) -> Any:
        check_device(self.api, self.config.device)
        check_head_size(self.api, self.config.device, self._facts.head_dim)
        env = {**self.config.engine_env(), **(self._log.env() if self._log else {})}
        with environment(env):  # vLLM's processes start inside and read it
            return self.api.AsyncLLM.from_engine_args(self.api.AsyncEngineArgs(**self.config.engine_kwargs()))

    def _cause(self, e: BaseException) -> str:
        """vLLM's account of e: the exception's message, or what its process logged when the
        message only points there or is the logged one rewrapped (then the logged one names
        its type: "AssertionError: ..." rather than "Exception: Call to ... failed: ...")."""
        cause = describe(e)
        logged = self._log.last_error() if self._log is not None else ""
        if logged and (points_elsewhere(cause) or logged.partition(": ")[2] in cause):
            return logged
        return cause

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    # ---- engine thread: calls between loop turns ----------------------------------------

    def _run(self, coro) -> Any:
        """Drive one of vLLM's coroutines to its end (between loop turns: streams run meanwhile)."""
        return self._loop.run_until_complete(coro)

    def _prepare(self, state: RequestState) -> tuple[VLLMSample, Any]:
        sample = VLLMSample(state=state, rid="")
        try:  # vLLM's own checks of every request before any is admitted: a batch is refused whole
            params = self.api.SamplingParams(**sample.sampling_kwargs(
                seeded=self.config.seeded, delta_kind=self.api.RequestOutputKind.DELTA))
        except (ValueError, TypeError) as e:
            raise RolloutError(f"vLLM refuses sample {state.sample_id}'s sampling parameters: {e}") from e
        return sample, params

    def _new_request_id(self, serial: int, sample_id: int) -> str:
        return request_id(self._rid_prefix, serial, sample_id)

    def _load_weights(self, named: Mapping[str, object], version: int) -> None:
        self._check_loadable(version)
        pairs = check_weights(self._facts, named)
        try:
            for group in buckets(pairs, bucket_bytes=self.config.weight_bucket_bytes,
                                 unit=lambda pair: decoder_layer(pair[0]), nbytes=lambda pair: pair[1].nbytes):
                with shared_bucket(group, self.config.dtype) as bucket:
                    answers = self._run(self._engine.collective_rpc(LOAD_CALL, args=(bucket.path, list(bucket.entries))))
                    check_loaded(answers, bucket, self.config.tp_size)
            # requests aborted a moment ago may still hold KV blocks: retried until vLLM lets go
            reset_when_idle(lambda: self._run(self._engine.reset_prefix_cache()), self._sleep,
                            self.config.flush_timeout_s)
        except BaseException as e:
            # Some tensors may already be replaced: this engine's weights are unknown now.
            failure = load_failure(self._engine_name, version, e, self._cause(e))
            self._fail(failure)
            raise failure from e
        self._loaded(version)

    # ---- engine thread: streams ---------------------------------------------------------

    def _start(self, sample: VLLMSample, prepared: Any) -> None:
        self._spawn(self._consume(sample, sample.rid, prepared))

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
                self._fail(run_failure(self._engine_name, e, self._cause(e)))

    def _absorb(self, sample: VLLMSample, output: Any) -> None:
        pairs, reason = new_pairs(sample, output)
        pairs, finish = cut_at_stop(sample, pairs)
        self._take(sample, pairs)
        if finish is None:
            finish = finish_of(sample, reason)
        elif reason is None:  # finished here before vLLM noticed
            self._abort_request(sample.rid)
        self._settle(sample, finish, len(pairs))

    def _abort_request(self, rid: str) -> None:
        self._spawn(self._engine.abort(rid))  # runs at the loop's next turn
