"""FakeSGLangEngineForTests: a CPU stand-in for `sglang.Engine`, for testing the SGLang
adapter where SGLang cannot run. Test-only; test_sglang_conformance.py checks its surface
against the installed package.

Written from SGLang's source (srt/entrypoints/engine.py, managers/tokenizer_manager.py,
managers/scheduler.py, scheduler_components/weight_updater.py and flush_wrapper.py), one
release line at a time: RULES["0.5.9"] (0.5.9-0.5.20) and RULES["0.5.21"] (0.5.21-0.5.23).
- Engine: keyword construction with ServerArgs names (unknown ones raise TypeError); an event
  loop bound at construction that the synchronous methods drive with run_until_complete (so
  they fail while that loop runs); no pause_generation, continue_generation or
  abort_request (its TokenizerManager aborts); begin/end_weight_update only from 0.5.21.
- TokenizerManager.abort_request(rid) ignores a rid it has not registered (a stream
  registers its rid once iterated); from 0.5.20 it sends one abort per rid. The scheduler
  applies aborts at its next step to every request whose rid *starts with* the given one.
- A generate stream holds model_update_lock as a reader until it ends; weight updates and
  the session calls take it as the writer, so they wait for every open stream.
- The scheduler is idle when nothing runs and its last batch was empty (one empty step
  after the last request ended), and from 0.5.20 when nothing is queued. flush_cache
  succeeds only then; release_memory_occupation asserts it.
- update_weights_from_tensor is refused outside a session from 0.5.21; with flush_cache=True
  on a busy scheduler it fails (0.5.21) or kills the scheduler with an assert (0.5.9).
- Chunks `{"output_ids", "meta_info": {"id", "finish_reason", "completion_tokens",
  "output_token_logprobs": [(logprob, id, None)], ...}}`, cumulative (incremental with
  incremental_streaming_output, a server argument from 0.5.20); answers (success, message),
  flush_cache's an object.
Tokens come from fake_sglang_model (deterministic in the weights and the prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import pickle
import threading
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import SimpleNamespace

import fake_sglang_model as model
import numpy as np
import torch.multiprocessing  # noqa: F401  (registers the tensor reductions SGLang's serializer uses)
from safetensors.torch import load_file

SERVER_ARGS = {"model_path": None, "tp_size": 1, "mem_fraction_static": None, "dtype": "auto",
               "stream_interval": 1, "skip_tokenizer_init": False, "enable_deterministic_inference": False,
               "context_length": None, "log_level": "info", "random_seed": None,
               "incremental_streaming_output": False, "enable_memory_saver": False}
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
                 "ignore_eos", "no_stop_trim", "skip_special_tokens", "sampling_seed", "min_new_tokens"}
ABORTED = {"type": "abort", "message": "Abort in running batch", "status_code": None, "err_type": None}


@dataclass(frozen=True)
class SGLangRules:
    """What differs between SGLang release lines, as their source has it."""

    release: str
    weight_update_session: bool  # Engine.begin/end_weight_update; updates refused outside one
    flush_counts_queued: bool    # flush_cache also refuses while requests wait in the queue
    abort_once_per_rid: bool     # TokenizerManager sends a rid's abort once (ReqState.abort_sent)
    incremental_streaming: bool  # ServerArgs has incremental_streaming_output

    def server_args(self) -> dict:
        """The ServerArgs names (and defaults) this stand-in accepts."""
        return {k: v for k, v in SERVER_ARGS.items()
                if self.incremental_streaming or k != "incremental_streaming_output"}


RULES = {"0.5.9": SGLangRules(release="0.5.9", weight_update_session=False, flush_counts_queued=False,
                              abort_once_per_rid=False, incremental_streaming=False),
         "0.5.21": SGLangRules(release="0.5.21", weight_update_session=True, flush_counts_queued=True,
                               abort_once_per_rid=True, incremental_streaming=True)}


@dataclass
class _Req:
    rid: str
    input_ids: list[int]
    params: dict
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prefix: int = 0
    finish: dict | None = None
    chunks: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent: int = 0
    abort_sent: bool = False


class _FakeTokenizerManager:
    """The part of SGLang's TokenizerManager the adapter touches: abort_request, rid_to_state."""

    def __init__(self, engine: FakeSGLangEngineForTests):
        self.engine = engine
        self.rid_to_state: dict[str, _Req] = {}

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        engine = self.engine
        engine.events.append(("abort", rid))
        if not abort_all:
            state = self.rid_to_state.get(rid)
            if not rid or state is None:
                return
            if engine.rules.abort_once_per_rid:
                if state.abort_sent:
                    return
                state.abort_sent = True
        engine._inbox.append((rid, abort_all))
        engine._wake()


class _ModelUpdateLock:
    """SGLang's model_update_lock (an RWLock): streams share it, a writer waits for them all
    and keeps new ones out. Polls every tick, which a fake may."""

    def __init__(self, tick: float):
        self.tick, self.readers, self.writer = tick, 0, False

    async def acquire_read(self) -> None:
        while self.writer:
            await asyncio.sleep(self.tick)
        self.readers += 1

    def release_read(self) -> None:
        self.readers -= 1

    @contextlib.asynccontextmanager
    async def writing(self):
        while self.writer:
            await asyncio.sleep(self.tick)
        self.writer = True
        try:
            while self.readers:
                await asyncio.sleep(self.tick)
            yield
        finally:
            self.writer = False


class FakeSGLangEngineForTests:
    """Use as SGLangEngine(config, engine_factory=FAKES["0.5.21"]). Records the control calls
    and generate requests it got in `events` and `requests`.

    Test knobs: eos_token_ids (the model's EOS), hold_new_requests (requests wait before
    registering until open_admission()), abort_after_tokens (SGLang aborts a request itself,
    as on memory exhaustion), fail_updates (update_weights_from_tensor answers failure),
    finish_alone (a finish comes in a chunk of its own, with no new token), busy_flushes
    (that many flush_cache calls are refused, as while the scheduler still finishes a batch)."""

    rules = RULES["0.5.9"]

    def __init__(self, *, eos_token_ids: tuple[int, ...] | None = None, step_s: float = 0.0005,
                 hold_new_requests: bool = False, abort_after_tokens: int | None = None,
                 fail_updates: bool = False, finish_alone: bool = False, busy_flushes: int = 0, **kwargs):
        accepted = self.rules.server_args()
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got unexpected keyword arguments {unknown}")
        self.server_args = SimpleNamespace(**{**SERVER_ARGS, **accepted, **kwargs})
        root = Path(self.server_args.model_path)
        hf = json.loads((root / "config.json").read_text())
        self.vocab_size = int(hf["vocab_size"])
        eos = hf.get("eos_token_id")
        self.eos_token_ids = set(eos_token_ids if eos_token_ids is not None else
                                 ([eos] if isinstance(eos, int) else eos or []))
        self.context_len = self.server_args.context_length or int(hf.get("max_position_embeddings", 4096))
        self.tied = bool(hf.get("tie_word_embeddings", False))
        tensors = load_file(str(root / "model.safetensors"))
        self._shapes = {n: tuple(t.shape) for n, t in tensors.items()}
        self._digests = {n: model.digest(t) for n, t in tensors.items()}
        self._weights_key = model.weights_key(self._digests)
        self.step_s = step_s
        self.events: list[tuple] = []
        self.requests: list[dict] = []
        self.tokenizer_manager = _FakeTokenizerManager(self)
        self._waiting: list[_Req] = []
        self._running: dict[str, _Req] = {}
        self._inbox: list[tuple[str, bool]] = []
        self._last_batch = 0
        self._lock = _ModelUpdateLock(step_s)
        self.session_open = False
        self.memory_released = False
        self._rng = np.random.default_rng()
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        self._work = asyncio.Event()
        self._scheduler: asyncio.Task | None = None
        self._admit = asyncio.Event()
        if not hold_new_requests:
            self._admit.set()
        self.abort_after_tokens = abort_after_tokens
        self.fail_updates = fail_updates
        self.finish_alone = finish_alone
        self.busy_flushes = busy_flushes
        self.finished: dict[str, dict] = {}  # rid -> finish_reason, guarded by _done
        self._done = threading.Condition()

    # ---- test helpers (any thread) -----------------------------------------------------

    def open_admission(self) -> None:
        self.loop.call_soon_threadsafe(self._admit.set)

    def wait_for_requests(self, n: int, timeout_s: float = 30.0) -> list[dict]:
        with self._done:
            assert self._done.wait_for(lambda: len(self.requests) >= n, timeout_s), "requests did not come"
            return list(self.requests)

    def wait_finished(self, rid: str, timeout_s: float = 30.0) -> dict:
        with self._done:
            assert self._done.wait_for(lambda: rid in self.finished, timeout_s), f"{rid} did not finish"
            return self.finished[rid]

    # ---- generation ------------------------------------------------------------------

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             logprob_start_len=None, stream=False, rid=None, **unused):
        if prompt is not None or not isinstance(input_ids, list) or not all(isinstance(t, int) for t in input_ids):
            raise ValueError("this fake takes one request as input_ids: list[int]")
        with self._done:
            self.requests.append({"input_ids": list(input_ids), "sampling_params": dict(sampling_params or {}),
                                  "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
                                  "stream": stream, "rid": rid})
            self._done.notify_all()
        params = dict(sampling_params or {})
        if set(params) - SAMPLING_KEYS:
            raise TypeError(f"SamplingParams got unexpected keys {sorted(set(params) - SAMPLING_KEYS)}")
        gen = self._stream(_Req(rid=rid, input_ids=list(input_ids), params=params))
        if stream:
            return gen
        chunks = [chunk async for chunk in gen]
        return chunks[-1]

    async def _stream(self, req: _Req):
        await self._admit.wait()
        states = self.tokenizer_manager.rid_to_state
        if req.rid in states:
            raise ValueError(f"Duplicate request ID: {req.rid}")
        states[req.rid] = req
        try:
            await self._lock.acquire_read()
            try:
                self._enqueue(req)
                while True:
                    chunk = await req.chunks.get()
                    yield chunk
                    if chunk["meta_info"]["finish_reason"] is not None:
                        return
            finally:
                self._lock.release_read()
        finally:
            states.pop(req.rid, None)

    def _enqueue(self, req: _Req) -> None:
        if self.memory_released:
            raise RuntimeError("generation while the memory occupation is released")
        req.prefix = model.prefix_hash(req.input_ids)
        if any(not 0 <= t < self.vocab_size for t in req.input_ids):
            self._finish(req, {"type": "abort", "message": "token id out of vocabulary", "status_code": 400})
            return
        self._waiting.append(req)
        self._wake()

    def _wake(self) -> None:
        self._work.set()
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = self.loop.create_task(self._schedule())

    async def _schedule(self) -> None:
        while True:
            await self._work.wait()
            self._step()
            if not (self._running or self._waiting or self._inbox or self._last_batch):
                self._work.clear()
            await asyncio.sleep(self.step_s)

    def _step(self) -> None:
        """One scheduler iteration: aborts first (by rid prefix), then the queue joins the
        running batch, then every running request decodes one token."""
        batch = 0
        aborts, self._inbox = self._inbox, []
        for rid, abort_all in aborts:
            for req in [r for r in self._waiting if abort_all or r.rid.startswith(rid)]:
                self._waiting.remove(req)
                self._finish(req, ABORTED)
            for req in [r for r in self._running.values() if abort_all or r.rid.startswith(rid)]:
                self._finish(req, ABORTED)
                batch += 1
        self._running.update((r.rid, r) for r in self._waiting)
        self._waiting.clear()
        for req in list(self._running.values()):
            self._decode_one(req)
            batch += 1
        self._last_batch = batch

    def idle(self) -> bool:
        """SGLang's Scheduler.is_fully_idle, as flush_cache and release_memory_occupation see it."""
        queued = self.rules.flush_counts_queued and bool(self._waiting)
        return not self._running and self._last_batch == 0 and not queued

    def _decode_one(self, req: _Req) -> None:
        position = len(req.input_ids) + len(req.out)
        token, logprob = model.sample(self._weights_key, req.prefix, position, self.vocab_size, req.params,
                                      self.server_args.enable_deterministic_inference, self._rng)
        req.out.append(token)
        req.logprobs.append(logprob)
        req.prefix = model.mix(req.prefix, token)
        p = req.params
        if self.abort_after_tokens is not None and len(req.out) >= self.abort_after_tokens:
            self._finish(req, {"type": "abort", "message": "KV cache exhausted", "status_code": 503})
        elif len(req.out) >= p.get("max_new_tokens", 128) or len(req.input_ids) + len(req.out) >= self.context_len:
            self._finish(req, {"type": "length", "length": len(req.out)})
        elif not p.get("ignore_eos", False) and token in {*(p.get("stop_token_ids") or ()), *self.eos_token_ids}:
            self._finish(req, {"type": "stop", "matched": token})
        elif len(req.out) % self.server_args.stream_interval == 0:
            req.chunks.put_nowait(self._chunk(req))

    def _chunk(self, req: _Req) -> dict:
        incremental = self.server_args.incremental_streaming_output
        start = req.sent if incremental else 0
        req.sent = len(req.out)
        meta = {"id": req.rid, "finish_reason": req.finish, "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.out), "cached_tokens": 0,
                "output_token_logprobs": [(lp, t, None) for lp, t in zip(req.logprobs[start:], req.out[start:])]}
        chunk = {"output_ids": list(req.out[start:]), "meta_info": meta}
        if not self.server_args.skip_tokenizer_init:
            chunk["text"] = ""
        return chunk

    def _finish(self, req: _Req, reason: dict) -> None:
        if self.finish_alone and reason["type"] != "abort":
            req.chunks.put_nowait(self._chunk(req))
        req.finish = reason
        self._running.pop(req.rid, None)
        req.chunks.put_nowait(self._chunk(req))
        with self._done:
            self.finished[req.rid] = reason
            self._done.notify_all()

    # ---- control (synchronous, driving self.loop like SGLang's Engine) ----------------

    def flush_cache(self):
        return self.loop.run_until_complete(self._flush())

    async def _flush(self):
        ok = self.idle() and self.busy_flushes <= 0
        self.busy_flushes -= 1
        self.events.append(("flush_cache", ok))
        return SimpleNamespace(success=ok, message="")

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        payloads = []
        for _ in range(self.server_args.tp_size):  # one pickled copy per TP rank, as SGLang sends
            buf = io.BytesIO()
            ForkingPickler(buf).dump(named_tensors)
            payloads.append(buf.getvalue())
        self.events.append(("update_weights_from_tensor", tuple(n for n, _ in named_tensors), flush_cache))
        return self.loop.run_until_complete(self._update(payloads[0], flush_cache))

    async def _update(self, payload: bytes, flush_cache: bool):
        async with self._lock.writing():
            if self.rules.weight_update_session and not self.session_open:
                return False, ("update_weights_from_tensor must run between begin_weight_update() "
                               "and end_weight_update()")
            ok, message = self._replace(pickle.loads(payload))
            if ok and flush_cache and not self.idle():
                if not self.rules.weight_update_session:
                    raise AssertionError("Cache flush failed after updating weights (the scheduler exits)")
                return False, ("Weights were updated, but the cache was not flushed because requests are "
                               "still running or queued. Retract or finish them, then call /flush_cache.")
            return ok, message

    def _replace(self, named) -> tuple[bool, str]:
        if self.fail_updates:
            return False, "Failed to update weights: CUDA error: an illegal memory access"
        for name, t in named:
            if self.tied and name == "lm_head.weight":
                continue
            if name not in self._shapes:
                return False, f"Failed to update weights: unknown parameter {name}"
            if tuple(t.shape) != self._shapes[name]:
                return False, f"Failed to update weights: {name} shape {tuple(t.shape)} != {self._shapes[name]}"
        for name, t in named:
            if name in self._shapes:
                self._digests[name] = model.digest(t)
        self._weights_key = model.weights_key(self._digests)
        return True, "Succeeded to update model weights."

    def release_memory_occupation(self, tags=None):
        self.events.append(("release_memory_occupation", tags))
        if not self.idle():  # an assert in SGLang's scheduler, which then exits
            raise AssertionError("release_memory_occupation should be called only when server is idle.")
        self.memory_released = True

    def resume_memory_occupation(self, tags=None):
        self.events.append(("resume_memory_occupation", tags))
        self.memory_released = False

    def shutdown(self) -> None:
        self.events.append(("shutdown",))
        if self._scheduler is not None:
            self._scheduler.cancel()


class FakeSGLang059ForTests(FakeSGLangEngineForTests):
    """SGLang 0.5.9-0.5.20: no weight-update session."""

    rules = RULES["0.5.9"]


class FakeSGLang0521ForTests(FakeSGLangEngineForTests):
    """SGLang 0.5.21-0.5.23: updates only inside begin_weight_update()/end_weight_update()."""

    rules = RULES["0.5.21"]

    def begin_weight_update(self, selector: str = "all"):
        self.events.append(("begin_weight_update",))
        return self.loop.run_until_complete(self._session(True))

    def end_weight_update(self):
        self.events.append(("end_weight_update",))
        return self.loop.run_until_complete(self._session(False))

    async def _session(self, opening: bool):
        async with self._lock.writing():
            if opening == self.session_open:
                return False, ("a weight-update session is already open; call end_weight_update() first"
                               if opening else "no weight-update session is open; call begin_weight_update() first")
            self.session_open = opening
            return True, "Success"


FAKES = {"0.5.9": FakeSGLang059ForTests, "0.5.21": FakeSGLang0521ForTests}


class ShortContextFake(FakeSGLang0521ForTests):
    """SGLang's context is 12 tokens, and it reports a finish in a chunk of its own."""

    def __init__(self, **kwargs):
        super().__init__(**{**kwargs, "context_length": 12}, finish_alone=True)
