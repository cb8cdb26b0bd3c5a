"""The SGLang adapter against the installed SGLang package (no GPU needed): every Engine and
TokenizerManager call the adapter makes, with its keywords, binds to the installed
signature; Engine(**kwargs) makes a ServerArgs; every request's sampling parameters pass
SamplingParams.verify(); the weight-update session calls exist exactly where the adapter
expects them; and the stand-in plays the rules of the installed release.

The calls are not listed by hand: the adapter runs a whole scenario against the stand-in of
the installed release line through a recorder, and what it asked is checked. Skipped unless
`import sglang` works (pip install '.[sglang]')."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect

import pytest
from engine_contract import Collected, collect, make_state
from fake_sglang import FAKES, RULES, SAMPLING_KEYS

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.sglang.engine import SGLangEngine, SGLangEngineConfig

sglang = pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang

ENGINE = "sglang.srt.entrypoints.engine"
MANAGER = "sglang.srt.managers.tokenizer_manager"
SCHEDULER = "sglang.srt.managers.scheduler"
VERSION = 3


def _release() -> tuple[int, ...]:
    return tuple(int(p) for p in sglang.__version__.split(".")[:3] if p.isdigit())


def _line() -> str:
    """The stand-in's release line for the installed SGLang."""
    return "0.5.21" if _release() >= (0, 5, 21) else "0.5.9"


def _def_node(module: str, qualname: str):
    """(the def of Class.method in the installed source of `module` or None, that source)."""
    text = open(importlib.util.find_spec(module).origin).read()
    cls_name, _, fn_name = qualname.rpartition(".")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == fn_name:
                    return item, text
    return None, text


def _source(module: str, qualname: str) -> str:
    """Source of Class.method as installed ("" when absent), read without importing."""
    node, text = _def_node(module, qualname)
    return "" if node is None else ast.get_source_segment(text, node) or ""


def _function(module: str, qualname: str):
    """The installed Class.method, or None. Imported where its module imports here; some
    releases' engine modules load CUDA kernels at import and need a GPU driver, and then it
    is compiled from its def in the installed source with body, annotations and default
    values left out: the same parameters, for inspect."""
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return _compiled(module, qualname)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _compiled(module: str, qualname: str):
    node, _ = _def_node(module, qualname)
    if node is None:
        return None
    args = node.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    node.body, node.decorator_list, node.returns = [ast.Pass()], [], None
    namespace: dict = {}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), module, "exec"), namespace)
    return namespace[node.name]


class _Recorder:
    """Stands between the adapter and the stand-in: records every attribute the adapter
    reads on the engine (and on its tokenizer_manager) and the arguments of every call."""

    def __init__(self, target, log: list, where: str = "Engine"):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_where", where)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if name == "tokenizer_manager":
            self._log.append((self._where, name, None))
            return _Recorder(value, self._log, "TokenizerManager")
        if not inspect.ismethod(value):
            self._log.append((self._where, name, None))
            return value

        def call(*args, **kwargs):
            self._log.append((self._where, name, (args, kwargs)))
            return value(*args, **kwargs)

        return call


@pytest.fixture(scope="module")
def asked(tmp_path_factory) -> list:
    """What the adapter asked of SGLang over one scenario: start, generate (sampled, greedy,
    with stop tokens, resumed), export and import, abort, load weights, release and resume
    memory, close."""
    ckpt = build_tiny_checkpoint(tmp_path_factory.mktemp("conformance"), arch="qwen3", seed=0)
    log: list = []

    def factory(**kwargs):
        log.append(("Engine", "__init__", ((), kwargs)))
        return _Recorder(FAKES[_line()](**kwargs), log)

    config = SGLangEngineConfig(model_path=str(ckpt), stream_interval=2, weight_version=VERSION,
                                extra_engine_kwargs={"random_seed": 0})
    with SGLangEngine(config, engine_factory=factory) as engine:
        engine.submit([make_state(1, VERSION, max_new=300, top_k=20, top_p=0.9),
                       make_state(2, VERSION, temperature=0.0, stop=(7, 9)),
                       make_state(3, VERSION, output=(4, 5), logprobs=(-1.0, -1.0))])
        collect(engine, [2, 3], {3: Collected(ids=[4, 5], logprobs=[-1.0, -1.0])})
        engine.import_states(engine.export_states([1]))
        engine.abort([1])
        engine.load_weights(load_pretrained(ckpt).named_weights(), VERSION + 1)
        engine.release_memory()
        engine.resume_memory()
    return log


def _calls(asked, where: str) -> list[tuple[str, tuple, dict]]:
    return [(name, *args) for w, name, args in asked if w == where and args is not None]


def test_every_engine_call_binds_to_the_installed_signature(asked):
    calls = [c for c in _calls(asked, "Engine") if c[0] != "__init__"]
    assert {"async_generate", "update_weights_from_tensor", "flush_cache", "release_memory_occupation",
            "resume_memory_occupation", "shutdown"} <= {name for name, _, _ in calls}
    for name, args, kwargs in calls:
        method = _function(ENGINE, f"Engine.{name}")
        assert callable(method), f"sglang {sglang.__version__}: Engine has no {name}()"
        inspect.signature(method).bind(None, *args, **kwargs)  # TypeError names what does not fit
    assert inspect.iscoroutinefunction(_function(ENGINE, "Engine.async_generate"))


def test_attributes_the_adapter_reads_are_set_by_engine(asked):
    init = _source(ENGINE, "Engine.__init__")
    for name in {name for w, name, args in asked if w == "Engine" and args is None}:
        assert f"self.{name} =" in init, f"sglang {sglang.__version__}: Engine.__init__ sets no self.{name}"


def test_aborts_bind_to_the_tokenizer_managers_abort_request(asked):
    calls = _calls(asked, "TokenizerManager")
    assert calls and {name for name, _, _ in calls} == {"abort_request"}
    abort = _function(MANAGER, "TokenizerManager.abort_request")
    for _, args, kwargs in calls:
        inspect.signature(abort).bind(None, *args, **kwargs)


def test_engine_kwargs_make_a_server_args(asked):
    from sglang.srt.server_args import ServerArgs

    (kwargs,) = [args[1] for w, name, args in asked if name == "__init__"]
    params = inspect.signature(ServerArgs).parameters
    assert set(kwargs) <= set(params), sorted(set(kwargs) - set(params))
    host = {}
    if _release() < (0, 5, 21):
        # These releases resolve and validate every argument at construction, which looks
        # for an accelerator: name the CPU and an attention backend a GPU would get.
        host = {"device": "cpu", "attention_backend": "triton"}
    args = ServerArgs(**kwargs, **host)
    assert args.skip_tokenizer_init is True and args.stream_interval == 2
    assert args.enable_deterministic_inference is True


def test_every_requests_sampling_params_pass_verify(asked):
    from sglang.srt.sampling.sampling_params import SamplingParams

    requests = [kwargs for name, _, kwargs in _calls(asked, "Engine") if name == "async_generate"]
    assert len(requests) >= 4
    for request in requests:
        params = SamplingParams(**request["sampling_params"])
        params.normalize(None)  # no tokenizer: skip_tokenizer_init
        params.verify(320)


def test_the_weight_update_session_is_where_the_adapter_expects_it(asked):
    begin, end = _function(ENGINE, "Engine.begin_weight_update"), _function(ENGINE, "Engine.end_weight_update")
    has_session = callable(begin)
    assert has_session is (_release() >= (0, 5, 21)) and callable(end) is has_session
    control = [name for name, _, _ in _calls(asked, "Engine")
               if name in ("begin_weight_update", "update_weights_from_tensor", "end_weight_update")]
    updates = ["update_weights_from_tensor"] * control.count("update_weights_from_tensor")
    assert control == (["begin_weight_update", *updates, "end_weight_update"] if has_session else updates)
    if has_session:
        inspect.signature(begin).bind(None)
        inspect.signature(end).bind(None)


def test_engine_offers_no_pause_or_abort_call():
    for name in ("pause_generation", "continue_generation", "abort_request"):
        assert _function(ENGINE, f"Engine.{name}") is None, f"Engine.{name} exists now: the stand-in should offer it"


def test_the_stand_in_plays_the_installed_release():
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    rules = RULES[_line()]
    assert callable(_function(ENGINE, "Engine.begin_weight_update")) is rules.weight_update_session
    if _release() in ((0, 5, 9), (0, 5, 21), (0, 5, 22), (0, 5, 23)):  # the lines' own sources
        assert ("abort_sent" in _source(MANAGER, "TokenizerManager.abort_request")) is rules.abort_once_per_rid
        queued = ("waiting_queue" in _source(SCHEDULER, "Scheduler.is_fully_idle")
                  and "is_fully_idle" in _source(SCHEDULER, "Scheduler.flush_cache"))
        assert queued is rules.flush_counts_queued
    assert "startswith(recv_req.rid)" in _source(SCHEDULER, "Scheduler.abort_request")
    assert set(rules.server_args()) <= set(inspect.signature(ServerArgs).parameters)
    if _release() in ((0, 5, 9), (0, 5, 21), (0, 5, 22), (0, 5, 23)):
        assert rules.incremental_streaming is ("incremental_streaming_output" in inspect.signature(ServerArgs).parameters)
    assert SAMPLING_KEYS <= set(inspect.signature(SamplingParams).parameters)
