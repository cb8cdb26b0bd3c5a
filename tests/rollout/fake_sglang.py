"""FakeSGLangEngineForTests: a CPU stand-in for `sglang.Engine`, for testing the SGLang
adapter where SGLang cannot run. Test-only.

It follows the public surface the adapter uses and the shapes SGLang produces: keyword
construction with ServerArgs names (unknown ones raise TypeError), an event loop bound at
construction that the synchronous methods drive with run_until_complete (so they fail while
that loop runs, as SGLang's do), `async_generate(..., stream=True)` returning an async
generator that registers its rid only once iterated (an earlier abort_request is ignored, as
in SGLang), cumulative chunks `{"output_ids", "meta_info": {"id", "finish_reason",
"completion_tokens", "output_token_logprobs": [(logprob, id, None)], ...}}`, finish reasons
{"type": "length" | "stop" | "abort", ...}, update_weights_from_tensor pickling the tensors
for a scheduler process, and (success, message) answers.

Tokens are a deterministic function of (weights, every token before them): logits come from
a hash of the weights and the prefix; sampling applies temperature, top-k and top-p as SGLang
does and, with enable_deterministic_inference and a sampling_seed, draws with Gumbel noise
keyed by (seed, position) as SGLang's multinomial_with_seed does (otherwise at random).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import pickle
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (registers the tensor reductions SGLang's serializer uses)
from multiprocessing.reduction import ForkingPickler
from safetensors.torch import load_file

SERVER_ARGS = {"model_path": None, "tp_size": 1, "mem_fraction_static": None, "dtype": "auto",
               "stream_interval": 1, "skip_tokenizer_init": False, "enable_deterministic_inference": False,
               "context_length": None, "log_level": "info", "random_seed": None,
               "incremental_streaming_output": False, "enable_memory_saver": False}
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
                 "ignore_eos", "no_stop_trim", "skip_special_tokens", "sampling_seed", "min_new_tokens"}
_MASK = (1 << 64) - 1


def _mix(h: int, token: int) -> int:
    return ((h ^ (token + 0x9E3779B97F4A7C15)) * 0x100000001B3) & _MASK


def _digest(t: torch.Tensor) -> bytes:
    return hashlib.blake2b(t.detach().to(torch.float32).contiguous().numpy().tobytes(), digest_size=16).digest()


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


class _FakeTokenizerManager:
    """The part of SGLang's TokenizerManager the adapter may touch: abort_request and rid_to_state."""

    def __init__(self, engine: FakeSGLangEngineForTests):
        self.engine = engine
        self.rid_to_state: dict[str, _Req] = {}

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.engine.events.append(("abort", rid))
        for req in list(self.rid_to_state.values()) if abort_all else [self.rid_to_state.get(rid)]:
            if req is not None and req.finish is None:
                self.engine._finish(req, {"type": "abort", "message": "Abort in running batch",
                                          "status_code": None, "err_type": None})


class FakeSGLangEngineForTests:
    """Use as SGLangEngine(config, engine_factory=FakeSGLangEngineForTests). Records the
    control calls and generate requests it got in `events` and `requests`.

    Test knobs: eos_token_ids (the model's EOS), hold_new_requests (requests wait before
    registering until open_admission()), abort_after_tokens (SGLang aborts a request itself,
    as on memory exhaustion), fail_updates (update_weights_from_tensor answers failure),
    finish_alone (a request's finish comes in a chunk of its own, with no new token)."""

    def __init__(self, *, eos_token_ids: tuple[int, ...] | None = None, step_s: float = 0.0005,
                 hold_new_requests: bool = False, abort_after_tokens: int | None = None,
                 fail_updates: bool = False, finish_alone: bool = False, **kwargs):
        unknown = sorted(set(kwargs) - set(SERVER_ARGS))
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got unexpected keyword arguments {unknown}")
        self.server_args = SimpleNamespace(**{**SERVER_ARGS, **kwargs})
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
        self._digests = {n: _digest(t) for n, t in tensors.items()}
        self._weights_key = self._key()
        self.step_s = step_s
        self.events: list[tuple] = []
        self.requests: list[dict] = []
        self.tokenizer_manager = _FakeTokenizerManager(self)
        self._running: dict[str, _Req] = {}
        self._paused = False
        self.memory_released = False
        self._rng = np.random.default_rng()
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        self._work = asyncio.Event()
        self._resume = asyncio.Event()
        self._resume.set()
        self._scheduler: asyncio.Task | None = None
        self._admit = asyncio.Event()
        if not hold_new_requests:
            self._admit.set()
        self.abort_after_tokens = abort_after_tokens
        self.fail_updates = fail_updates
        self.finish_alone = finish_alone
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
        await self._resume.wait()  # a paused engine holds new requests back
        if req.rid in self.tokenizer_manager.rid_to_state:
            raise ValueError(f"Duplicate request ID: {req.rid}")
        self.tokenizer_manager.rid_to_state[req.rid] = req
        if self.memory_released:
            raise RuntimeError("generation while the memory occupation is released")
        h = 0
        for t in req.input_ids:
            h = _mix(h, t)
        req.prefix = h
        if any(not 0 <= t < self.vocab_size for t in req.input_ids):
            self._finish(req, {"type": "abort", "message": "token id out of vocabulary", "status_code": 400})
        else:
            self._running[req.rid] = req
            self._work.set()
            if self._scheduler is None or self._scheduler.done():
                self._scheduler = self.loop.create_task(self._schedule())
        try:
            while True:
                chunk = await req.chunks.get()
                yield chunk
                if chunk["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            self.tokenizer_manager.rid_to_state.pop(req.rid, None)

    async def _schedule(self) -> None:
        while True:
            await self._work.wait()
            for req in list(self._running.values()):
                self._decode_one(req)
            if not self._running:
                self._work.clear()
            await asyncio.sleep(self.step_s)

    def _decode_one(self, req: _Req) -> None:
        token, logprob = self._sample(req)
        req.out.append(token)
        req.logprobs.append(logprob)
        req.prefix = _mix(req.prefix, token)
        p = req.params
        if self.abort_after_tokens is not None and len(req.out) >= self.abort_after_tokens:
            self._finish(req, {"type": "abort", "message": "KV cache exhausted", "status_code": 503})
        elif len(req.out) >= p.get("max_new_tokens", 128) or len(req.input_ids) + len(req.out) >= self.context_len:
            self._finish(req, {"type": "length", "length": len(req.out)})
        elif not p.get("ignore_eos", False) and token in {*(p.get("stop_token_ids") or ()), *self.eos_token_ids}:
            self._finish(req, {"type": "stop", "matched": token})
        elif len(req.out) % self.server_args.stream_interval == 0:
            req.chunks.put_nowait(self._chunk(req))

    def _sample(self, req: _Req) -> tuple[int, float]:
        p = req.params
        logits = np.random.default_rng([self._weights_key, req.prefix]).standard_normal(self.vocab_size) * 2.0
        temperature = p.get("temperature", 1.0)
        if temperature < 1e-6:  # SGLang: greedy, logprobs at temperature 1
            probs = _softmax(logits)
            token = int(np.argmax(logits))
            return token, float(np.log(probs[token]))
        probs = _softmax(logits / temperature)
        kept = _top_k_top_p(probs, p.get("top_k", -1), p.get("top_p", 1.0))
        seed = p.get("sampling_seed")
        if self.server_args.enable_deterministic_inference and seed is not None:
            position = len(req.input_ids) + len(req.out) - 1
            gumbel = np.random.default_rng([seed, position]).gumbel(size=self.vocab_size)
            with np.errstate(divide="ignore"):
                token = int(np.argmax(np.log(kept) + gumbel))
        else:
            token = int(self._rng.choice(self.vocab_size, p=kept / kept.sum()))
        return token, float(np.log(probs[token]))

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

    def pause_generation(self, mode: str = "retract"):
        self.events.append(("pause", mode))
        return self.loop.run_until_complete(self._pause(mode))

    async def _pause(self, mode: str) -> None:
        self._resume.clear()
        self._paused = True
        if mode == "abort":
            self.tokenizer_manager.abort_request(abort_all=True)
        while self._running:
            await asyncio.sleep(self.step_s)

    def continue_generation(self):
        self.events.append(("continue",))
        return self.loop.run_until_complete(self._continue())

    async def _continue(self) -> None:
        self._paused = False
        self._resume.set()

    def flush_cache(self):
        self.events.append(("flush_cache",))
        return self.loop.run_until_complete(self._flush())

    async def _flush(self):
        busy = bool(self._running)
        return SimpleNamespace(success=not busy, flushed_items=0,
                               error_msg="requests are running" if busy else "")

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        payloads = []
        for _ in range(self.server_args.tp_size):  # one pickled copy per TP rank, as SGLang sends
            buf = io.BytesIO()
            ForkingPickler(buf).dump(named_tensors)
            payloads.append(buf.getvalue())
        self.events.append(("update_weights_from_tensor", tuple(n for n, _ in named_tensors), flush_cache))
        return self.loop.run_until_complete(self._update(payloads[0]))

    async def _update(self, payload: bytes):
        while self._running:  # SGLang waits for running requests (model update lock)
            await asyncio.sleep(self.step_s)
        named = pickle.loads(payload)
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
                self._digests[name] = _digest(t)
        self._weights_key = self._key()
        return True, "Succeeded to update model weights."

    def release_memory_occupation(self, tags=None):
        self.events.append(("release_memory_occupation", tags))
        self.memory_released = True

    def resume_memory_occupation(self, tags=None):
        self.events.append(("resume_memory_occupation", tags))
        self.memory_released = False

    def shutdown(self) -> None:
        self.events.append(("shutdown",))
        if self._scheduler is not None:
            self._scheduler.cancel()

    def _key(self) -> int:
        h = hashlib.blake2b(digest_size=8)
        for name in sorted(self._digests):
            h.update(name.encode() + self._digests[name])
        return int.from_bytes(h.digest(), "little")


class EngineAbortFake(FakeSGLangEngineForTests):
    """An SGLang build whose Engine itself offers abort_request (the adapter prefers it)."""

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.events.append(("engine.abort_request", rid))
        self.tokenizer_manager.abort_request(rid=rid, abort_all=abort_all)


class ShortContextFake(FakeSGLangEngineForTests):
    """SGLang's context is 12 tokens, and it reports a finish in a chunk of its own."""

    def __init__(self, **kwargs):
        super().__init__(**{**kwargs, "context_length": 12}, finish_alone=True)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _top_k_top_p(probs: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    order = np.argsort(-probs, kind="stable")
    keep = np.ones(len(probs), dtype=bool)
    if 0 < top_k < len(probs):
        keep[order[top_k:]] = False
    sorted_p = probs[order]
    keep[order[(np.cumsum(sorted_p) - sorted_p) > top_p]] = False
    return np.where(keep, probs, 0.0)
