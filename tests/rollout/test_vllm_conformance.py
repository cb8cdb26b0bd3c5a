"""The vLLM adapter against the installed vLLM package (no GPU needed): every AsyncLLM call
the adapter makes, with its arguments, binds to the installed signature; the engine
arguments make an AsyncEngineArgs; every request's sampling parameters make a SamplingParams
(which checks its values); the outputs' fields the adapter reads exist; the worker extension
fits the installed worker, its in-place reload and the models' load_weights; and the
stand-in plays the rules of the installed release.

The calls are not listed by hand: the adapter runs a whole scenario against the stand-in of
the installed release line through a recorder, and what it asked is checked. Skipped unless
`import vllm` works (pip install '.[vllm]', in a venv of its own: it brings its own torch)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest
from engine_contract import Collected, collect, make_state
from fake_vllm import ENGINE_ARGS, FAKES, RULES, SAMPLING_KEYS, RequestOutputKind

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.vllm.config import WORKER_EXTENSION
from rlboost.rollout.vllm.engine import VLLMApi, VLLMEngine, VLLMEngineConfig

vllm = pytest.importorskip("vllm")
# importing vLLM's engine imports torch._inductor, whose torch.utils.mkldnn uses torch's own
# deprecated torch.jit.script_method: torch's warning, not ours
pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

VERSION = 3
ASYNC_LLM = "vllm.v1.engine.async_llm"


def _release() -> tuple[int, ...]:
    return tuple(int(p) for p in vllm.__version__.split(".")[:3] if p.isdigit())


def _line() -> str:
    """The stand-in's release line for the installed vLLM."""
    return "0.27" if _release() >= (0, 27) else "0.20"


def _source(module: str) -> str:
    return Path(importlib.util.find_spec(module).origin).read_text()


def _method_source(module: str, qualname: str) -> str:
    text = _source(module)
    cls_name, _, fn_name = qualname.rpartition(".")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == fn_name:
                    return ast.get_source_segment(text, item) or ""
    return ""


class _Recorder:
    """Stands between the adapter and the stand-in engine: records every call and its arguments."""

    def __init__(self, target, log: list):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if not callable(value):
            self._log.append((name, None))
            return value

        def call(*args, **kwargs):
            self._log.append((name, (args, kwargs)))
            return value(*args, **kwargs)

        return call


@pytest.fixture(scope="module")
def asked(tmp_path_factory) -> dict:
    """What the adapter asked of vLLM over one scenario: start, generate (sampled, greedy, top-k
    and top-p, with stop tokens, resumed), export and import, abort, load weights, close."""
    ckpt = build_tiny_checkpoint(tmp_path_factory.mktemp("conformance"), arch="qwen3", seed=0)
    fake = FAKES[_line()]
    log: list = []
    made: dict = {}

    class RecordedLLM:
        @staticmethod
        def from_engine_args(engine_args, *args, **kwargs):
            made["engine_args"] = engine_args
            log.append(("from_engine_args", ((engine_args, *args), kwargs)))
            return _Recorder(fake.AsyncLLM.from_engine_args(engine_args, *args, **kwargs), log)

    class RecordedArgs(fake.AsyncEngineArgs):
        def __init__(self, **kwargs):
            made["engine_kwargs"] = kwargs
            super().__init__(**kwargs)

    sampling: list = []

    class RecordedParams(fake.SamplingParams):
        def __init__(self, **kwargs):
            sampling.append(kwargs)
            super().__init__(**kwargs)

    api = VLLMApi(AsyncLLM=RecordedLLM, AsyncEngineArgs=RecordedArgs, SamplingParams=RecordedParams,
                  RequestOutputKind=fake.RequestOutputKind)
    config = VLLMEngineConfig(model_path=str(ckpt), stream_interval=2, weight_version=VERSION, tp_size=2,
                              extra_engine_kwargs={"seed": 0, "enforce_eager": True})
    with VLLMEngine(config, api=api) as engine:
        engine.submit([make_state(1, VERSION, max_new=300, top_k=20, top_p=0.9),
                       make_state(2, VERSION, temperature=0.0, stop=(7, 9)),
                       make_state(3, VERSION, output=(4, 5), logprobs=(-1.0, -1.0))])
        collect(engine, [2, 3], {3: Collected(ids=[4, 5], logprobs=[-1.0, -1.0])})
        engine.import_states(engine.export_states([1]))
        engine.abort([1])
        engine.load_weights(load_pretrained(ckpt).named_weights(), VERSION + 1)
    return {"log": log, "sampling": sampling, **made}


def _calls(asked) -> list[tuple[str, tuple, dict]]:
    return [(name, *args) for name, args in asked["log"] if args is not None]


def test_every_engine_call_binds_to_the_installed_signature(asked):
    from vllm.v1.engine.async_llm import AsyncLLM

    calls = _calls(asked)
    assert {"from_engine_args", "generate", "abort", "collective_rpc", "reset_prefix_cache", "shutdown"} <= \
        {name for name, _, _ in calls}
    for name, args, kwargs in calls:
        method = inspect.getattr_static(AsyncLLM, name, None)
        assert method is not None, f"vllm {vllm.__version__}: AsyncLLM has no {name}()"
        fn = method.__func__ if isinstance(method, (classmethod, staticmethod)) else method
        bound = (AsyncLLM,) if isinstance(method, classmethod) else (None,)
        inspect.signature(fn).bind(*bound, *args, **kwargs)  # TypeError names what does not fit
    for name in ("abort", "collective_rpc", "reset_prefix_cache"):
        assert inspect.iscoroutinefunction(getattr(AsyncLLM, name)), f"AsyncLLM.{name} is no coroutine"
    assert inspect.isasyncgenfunction(AsyncLLM.generate)
    assert not inspect.iscoroutinefunction(AsyncLLM.shutdown)


def test_engine_kwargs_make_an_async_engine_args(asked):
    from vllm import AsyncEngineArgs

    kwargs = asked["engine_kwargs"]
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert set(kwargs) <= fields, sorted(set(kwargs) - fields)
    args = AsyncEngineArgs(**kwargs)
    assert args.skip_tokenizer_init is True and args.tensor_parallel_size == 2 and args.stream_interval == 2
    assert args.worker_extension_cls == WORKER_EXTENSION
    from vllm.config.model import LogprobsMode

    assert args.logprobs_mode in LogprobsMode.__args__
    cpu = AsyncEngineArgs(**VLLMEngineConfig(model_path=kwargs["model"], device="cpu",
                                             kv_cache_bytes=64 << 20).engine_kwargs())
    assert cpu.kv_cache_memory_bytes == 64 << 20 and cpu.enforce_eager is True


def test_every_requests_sampling_params_make_a_sampling_params(asked):
    from vllm.sampling_params import RequestOutputKind as Kind
    from vllm.sampling_params import SamplingParams

    assert len(asked["sampling"]) >= 4
    for kwargs in asked["sampling"]:
        real = {**kwargs, "output_kind": Kind[kwargs["output_kind"].name]}
        params = SamplingParams(**real)  # checks its values
        assert params.logprobs == 0 and params.ignore_eos and params.output_kind == Kind.DELTA


def test_the_collective_rpc_reaches_the_worker_extension(asked):
    rpcs = [(args, kwargs) for name, args, kwargs in _calls(asked) if name == "collective_rpc"]
    assert rpcs and all(args[0] == "rlboost_load_weights" for args, _ in rpcs)
    module, _, name = WORKER_EXTENSION.rpartition(".")
    extension = getattr(importlib.import_module(module), name)
    for args, kwargs in rpcs:  # the arguments reach the method as vLLM passes them
        inspect.signature(extension.rlboost_load_weights).bind(None, *kwargs.get("args", args[2:]))


def test_the_worker_extension_fits_the_installed_worker():
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu_worker import Worker

    extension = resolve_obj_by_qualname(WORKER_EXTENSION)  # as worker_base.init_worker resolves it
    own = [a for a in dir(extension) if not a.startswith("__")]
    assert own and not [a for a in own if hasattr(Worker, a)]  # init_worker asserts no clash
    assert "self.model_runner" in _source("vllm.v1.worker.gpu_worker")
    assert _method_source("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.get_model")
    for module, cls in (("qwen3", "Qwen3ForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("llama", "LlamaForCausalLM")):
        load = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), cls).load_weights
        inspect.signature(load).bind(None, weights=[])


def test_the_installed_vllm_reloads_weights_in_place_from_an_iterator():
    """The worker extension loads through reload_weights(weights_iterator=...) wherever the
    release has it (every release of the supported range does), through the worker's method,
    which runs it under the worker's vLLM config."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    runner = inspect.signature(GPUModelRunner.reload_weights).parameters
    assert "weights_iterator" in runner and "is_checkpoint_format" in runner
    worker = inspect.signature(Worker.reload_weights).parameters
    assert "weights_iterator" in worker or any(p.kind is p.VAR_KEYWORD for p in worker.values())
    assert "set_current_vllm_config" in _method_source("vllm.v1.worker.gpu_worker", "Worker.reload_weights")
    # a layer is processed once all of its tensors arrived within one call: buckets hold whole layers
    assert "load_numel_total" in _source("vllm.model_executor.model_loader.reload.layerwise")


def test_the_outputs_hold_what_the_adapter_reads():
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    fields = {f.name for f in dataclasses.fields(CompletionOutput)}
    assert {"token_ids", "logprobs", "finish_reason", "stop_reason"} <= fields
    assert "outputs" in inspect.signature(RequestOutput.__init__).parameters
    assert "logprob" in {f.name for f in dataclasses.fields(Logprob)}


def test_the_stand_in_plays_the_installed_release():
    from vllm import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind as Kind
    from vllm.sampling_params import SamplingParams

    rules = RULES[_line()]
    capped = "self.temperature > 2.0" in _source("vllm.sampling_params")
    assert capped is (rules.temperature_cap == 2.0)
    assert set(ENGINE_ARGS) <= {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert SAMPLING_KEYS <= set(inspect.signature(SamplingParams).parameters)
    assert [k.name for k in Kind] == [k.name for k in RequestOutputKind]
    stop = _source("vllm.v1.core.sched.utils")
    assert stop.index("sampling_params.eos_token_id") < stop.index("sampling_params.stop_token_ids")
    assert "return False" in _method_source("vllm.v1.core.kv_cache_manager", "KVCacheManager.reset_prefix_cache")
    assert "final abort output" in _source("vllm.v1.engine.output_processor")
    assert "ignore_eos" in _method_source("vllm.sampling_params", "SamplingParams.update_from_generation_config")
