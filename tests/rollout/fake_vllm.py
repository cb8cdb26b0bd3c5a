"""FakeAsyncLLMForTests: a CPU stand-in for vLLM's `AsyncLLM` (with AsyncEngineArgs,
SamplingParams and RequestOutputKind), for testing the vLLM adapter where vLLM cannot run.
Test-only; test_vllm_conformance.py checks its surface against the installed package.

Written from vLLM's source (v1/engine/async_llm.py, output_processor.py, core_client.py,
v1/core/sched/scheduler.py and utils.py, v1/worker/worker_base.py, sampling_params.py,
engine/arg_utils.py, outputs.py), one release line at a time: RULES["0.20"] (0.20.0's source)
and RULES["0.27"] (0.27.0 and 0.33.0's).
- AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs)): unknown engine arguments raise
  TypeError (a dataclass); worker_extension_cls names a class mixed into every worker (a
  name the worker already has is refused, as worker_base.init_worker asserts).
- generate(prompt, sampling_params, request_id) is an async generator of RequestOutput; with
  RequestOutputKind.DELTA each output holds the tokens since the last one, every
  stream_interval tokens and at the finish. Stop: the EOS unless ignore_eos, then
  stop_token_ids (stop_reason = the token), then max_tokens / max_model_len ("length").
- abort(request_id) ends the stream at once with a final "abort" output (the output
  processor), while the engine core frees the request's KV blocks at its next step;
  reset_prefix_cache() answers False while any request holds blocks.
- collective_rpc(method, timeout, args, kwargs) runs method on each of tensor_parallel_size
  workers, arguments pickled across (workers are other processes), and returns their answers.
- A worker's model_runner.reload_weights(weights_iterator=...) reloads in place, processing
  each module once all of its parts arrived in that call (model_loader/reload/layerwise.py):
  a fused q/k/v or gate/up module given in part keeps the rest uninitialised.
- SamplingParams checks its values as _verify_args does; from 0.27 a temperature above 2 is
  refused. Per-request seeds seed one generator per request (a re-prefilled request draws
  anew from its seed). Log-probs (processed_logprobs) are those of softmax(logits / T).
Tokens come from fake_sglang_model (deterministic in the weights and the prefix).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import pickle
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

import fake_sglang_model as model
import numpy as np
from safetensors.torch import load_file

ENGINE_ARGS = {"model": None, "tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "dtype": "auto",
               "stream_interval": 1, "skip_tokenizer_init": False, "logprobs_mode": "raw_logprobs",
               "worker_extension_cls": "", "max_model_len": None, "enable_prefix_caching": None,
               "disable_log_stats": False, "seed": 0, "enforce_eager": False, "enable_sleep_mode": False,
               "enable_log_requests": False}
SAMPLING_KEYS = {"n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
                 "max_tokens", "min_tokens", "logprobs", "detokenize", "skip_special_tokens", "output_kind"}


@dataclass(frozen=True)
class VLLMRules:
    """What differs between vLLM release lines, as their source has it."""

    release: str
    temperature_cap: float | None  # SamplingParams refuses a temperature above it


RULES = {"0.20": VLLMRules(release="0.20", temperature_cap=None),
         "0.27": VLLMRules(release="0.27", temperature_cap=2.0)}


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool


class _SamplingParams:
    """vLLM's SamplingParams: keyword construction, values checked as _verify_args does."""

    rules = RULES["0.27"]

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - SAMPLING_KEYS)
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {unknown}")
        self.n, self.temperature, self.top_p, self.top_k, self.min_p = 1, 1.0, 1.0, 0, 0.0
        self.seed, self.stop_token_ids, self.ignore_eos, self.max_tokens = None, None, False, 16
        self.logprobs, self.detokenize, self.output_kind = None, True, RequestOutputKind.CUMULATIVE
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._verify()

    def _verify(self) -> None:
        cap = self.rules.temperature_cap
        if self.temperature < 0.0 or (cap is not None and self.temperature > cap):
            raise ValueError(f"temperature must be in [0, {cap}], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1 or not isinstance(self.top_k, int):
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.n != 1:
            raise ValueError("this stand-in samples one sequence per request")


class _AsyncEngineArgs:
    rules = RULES["0.27"]

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - set(ENGINE_ARGS))
        if unknown:
            raise TypeError(f"AsyncEngineArgs.__init__() got unexpected keyword arguments {unknown}")
        self.__dict__.update({**ENGINE_ARGS, **kwargs})


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: _SamplingParams
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prefix: int = 0
    sent: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False


class _FakeModel:
    """The worker's model: load_weights as vLLM's models take it (full tensors; unknown names
    raise KeyError as params_dict[name] does)."""

    def __init__(self, engine: FakeAsyncLLMForTests):
        self.engine = engine

    def load_weights(self, weights) -> set[str]:
        loaded = set()
        for name, t in weights:
            if self.engine.tied and name == "lm_head.weight":
                continue
            if name not in self.engine.shapes:
                raise KeyError(name)
            if tuple(t.shape) != self.engine.shapes[name]:
                raise ValueError(f"{name}: shape {tuple(t.shape)} != {self.engine.shapes[name]}")
            self.engine.pending_digests[name] = model.digest(t)
            loaded.add(name)
        return loaded

    def named_modules(self):
        """nn.Module's: the stand-in has no layers in a kernel form to pack again."""
        return iter(())


# vLLM's fused layers: the checkpoint's q/k/v and gate/up load into one module each
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
          "up_proj": "gate_up_proj"}
UNSET = b"uninitialised"  # the digest of a tensor vLLM left unset


def _fused_module(name: str) -> str:
    module, _, _ = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    return f"{parent}.{_FUSED.get(leaf, leaf)}"


class _FakeModelRunner:
    """The worker's model runner: get_model(), and reload_weights as vLLM's in-place reload
    has it (model_loader/reload): within one call, each module is restored to its checkpoint
    layout, loaded, and processed once every part of it has arrived; a module that got only
    some of its parts is processed at the end with the rest left uninitialised."""

    def __init__(self, engine: FakeAsyncLLMForTests):
        self.engine = engine
        self.model = _FakeModel(engine)

    def get_model(self):
        return self.model

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True) -> None:
        loaded = self.model.load_weights(list(weights_iterator))
        parts: dict[str, set[str]] = {}
        for name in self.engine.shapes:
            parts.setdefault(_fused_module(name), set()).add(name)
        for names in parts.values():
            if names & loaded:
                for name in names - loaded:
                    self.engine.pending_digests[name] = UNSET


class _FakeWorkerBase:
    """A worker as the extension sees it: self.model_runner (get_model, reload_weights)."""

    def __init__(self, engine: FakeAsyncLLMForTests, rank: int):
        self.rank = rank
        self.model_runner = _FakeModelRunner(engine)

    def execute_model(self):  # a worker method an extension must not shadow
        raise NotImplementedError


class FakeAsyncLLMForTests:
    """Use as VLLMEngine(config, api=api(FAKES["0.27"])). Records the control calls in `events`
    and the generate requests in `requests`. Test knobs (class attributes a subclass sets):
    step_s, abort_after_tokens (vLLM aborts a request itself), slow_abort_steps (steps the
    engine core takes to process an abort)."""

    rules = RULES["0.27"]
    step_s = 0.0005
    abort_after_tokens: int | None = None
    slow_abort_steps = 1

    @classmethod
    def from_engine_args(cls, engine_args, start_engine_loop=True, usage_context=None, stat_loggers=None):
        return cls(engine_args)

    def __init__(self, args):
        self.args = args
        root = Path(args.model)
        hf = json.loads((root / "config.json").read_text())
        self.vocab_size = int(hf["vocab_size"])
        eos = hf.get("eos_token_id")
        self.eos_token_id = eos if isinstance(eos, int) else (eos or [None])[0]
        self.max_model_len = args.max_model_len or int(hf.get("max_position_embeddings", 4096))
        self.tied = bool(hf.get("tie_word_embeddings", False))
        tensors = load_file(str(root / "model.safetensors"))
        self.shapes = {n: tuple(t.shape) for n, t in tensors.items()}
        self.digests = {n: model.digest(t) for n, t in tensors.items()}
        self.pending_digests: dict[str, bytes] = {}
        self.weights_key = model.weights_key(self.digests)
        self.events: list[tuple] = []
        self.requests: list[dict] = []
        self._running: dict[str, _Req] = {}
        self._aborting: dict[str, int] = {}  # rid -> steps until the engine core drops it
        self._rng = np.random.default_rng()
        self._scheduler: asyncio.Task | None = None
        self.workers = [self._worker(rank) for rank in range(args.tensor_parallel_size)]
        self.is_shut_down = False

    def _worker(self, rank: int):
        bases: tuple[type, ...] = (_FakeWorkerBase,)
        if self.args.worker_extension_cls:
            module, _, name = self.args.worker_extension_cls.rpartition(".")
            ext = getattr(importlib.import_module(module), name)
            for attr in dir(ext):
                if not attr.startswith("__"):
                    assert not hasattr(_FakeWorkerBase, attr), f"worker extension {ext} shadows {attr}"
            bases += (ext,)
        return type("FakeWorker", bases, {})(self, rank)

    # ---- generation ------------------------------------------------------------------

    async def generate(self, prompt, sampling_params, request_id, *, prompt_text=None, lora_request=None,
                       tokenization_kwargs=None, trace_headers=None, priority=0, data_parallel_rank=None):
        ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ValueError("this fake takes one request as {'prompt_token_ids': list[int]}")
        if not isinstance(sampling_params, _SamplingParams):
            raise TypeError("sampling_params must be a SamplingParams")
        if request_id in self._running:
            raise ValueError(f"Request id {request_id} already running.")
        self.requests.append({"prompt_token_ids": list(ids), "params": sampling_params, "request_id": request_id})
        if len(ids) + 1 > self.max_model_len or any(not 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"request {request_id}: prompt too long or token id out of vocabulary")
        req = _Req(rid=request_id, prompt=list(ids), params=sampling_params, prefix=model.prefix_hash(ids))
        self._running[request_id] = req
        self._wake()
        while True:
            out = await req.queue.get()
            yield out
            if out.finished:
                return

    def _wake(self) -> None:
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.get_event_loop().create_task(self._schedule())

    async def _schedule(self) -> None:
        while self._running or self._aborting:
            self._step()
            await asyncio.sleep(self.step_s)

    def _step(self) -> None:
        for rid in list(self._aborting):
            self._aborting[rid] -= 1
            if self._aborting[rid] <= 0:
                del self._aborting[rid]
                self._running.pop(rid, None)
        for req in [r for r in self._running.values() if not r.finished]:
            self._decode_one(req)

    def _decode_one(self, req: _Req) -> None:
        p = req.params
        params = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k or -1, "sampling_seed": p.seed}
        # one generator per request: draws follow (seed, tokens this request generated)
        token, logprob = model.sample(self.weights_key, req.prefix, len(req.out), self.vocab_size, params,
                                      p.seed is not None, self._rng)
        req.out.append(token)
        req.logprobs.append(logprob)
        req.prefix = model.mix(req.prefix, token)
        if self.abort_after_tokens is not None and len(req.out) >= self.abort_after_tokens:
            self._finish(req, "abort", None)
        elif not p.ignore_eos and token == self.eos_token_id:
            self._finish(req, "stop", None)
        elif token in (p.stop_token_ids or ()):
            self._finish(req, "stop", token)
        elif len(req.prompt) + len(req.out) >= self.max_model_len or len(req.out) >= p.max_tokens:
            self._finish(req, "length", None)
        elif len(req.out) % self.args.stream_interval == 0:
            req.queue.put_nowait(self._output(req, None, None))

    def _output(self, req: _Req, finish: str | None, stop_reason) -> RequestOutput:
        delta = req.params.output_kind == RequestOutputKind.DELTA
        start = req.sent if delta else 0
        req.sent = len(req.out)
        lps = [{t: Logprob(lp, 1)} for t, lp in zip(req.out[start:], req.logprobs[start:])] \
            if req.params.logprobs is not None else None
        completion = CompletionOutput(index=0, text="", token_ids=list(req.out[start:]), cumulative_logprob=None,
                                      logprobs=lps, finish_reason=finish, stop_reason=stop_reason)
        return RequestOutput(request_id=req.rid, prompt=None, prompt_token_ids=req.prompt, prompt_logprobs=None,
                             outputs=[completion], finished=finish is not None)

    def _finish(self, req: _Req, reason: str, stop_reason) -> None:
        req.finished = True
        self._running.pop(req.rid, None)
        req.queue.put_nowait(self._output(req, reason, stop_reason))

    async def abort(self, request_id, internal: bool = False) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.events.append(("abort", tuple(ids)))
        for rid in ids:
            req = self._running.get(rid)
            if req is None or req.finished:
                continue
            req.finished = True  # the output processor ends the stream now ...
            req.queue.put_nowait(self._output(req, "abort", None))
            self._aborting[rid] = self.slow_abort_steps  # ... the engine core frees it later
            self._wake()

    # ---- control ---------------------------------------------------------------------

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        args, kwargs = pickle.loads(pickle.dumps((tuple(args), dict(kwargs or {}))))  # to other processes
        self.events.append(("collective_rpc", method))
        answers = [getattr(w, method)(*args, **kwargs) for w in self.workers]
        self.digests.update(self.pending_digests)
        self.pending_digests.clear()
        self.weights_key = model.weights_key(self.digests)
        return answers

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        ok = not self._running and not self._aborting
        self.events.append(("reset_prefix_cache", ok))
        return ok

    def shutdown(self, timeout: float | None = None) -> None:
        self.events.append(("shutdown",))
        self.is_shut_down = True
        if self._scheduler is not None:
            self._scheduler.cancel()


def _line(release: str):
    rules = RULES[release]
    names = release.replace(".", "")
    engine = type(f"FakeVLLM{names}ForTests", (FakeAsyncLLMForTests,), {"rules": rules})
    params = type(f"FakeSamplingParams{names}", (_SamplingParams,), {"rules": rules})
    args = type(f"FakeAsyncEngineArgs{names}", (_AsyncEngineArgs,), {"rules": rules})
    return SimpleNamespace(AsyncLLM=engine, AsyncEngineArgs=args, SamplingParams=params,
                           RequestOutputKind=RequestOutputKind)


FAKES = {release: _line(release) for release in RULES}
