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
import importlib.util
import inspect
import textwrap

import pytest

from engine_contract import Collected, collect, make_state
from fake_sglang import FAKES, RULES, SAMPLING_KEYS, SERVER_ARGS
from rlboost.models import load_pretrained
from rlboost.rollout.sglang.engine import SGLangEngine, SGLangEngineConfig

sglang = pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang
# The class itself: `sglang.Engine` may be a lazy-import stand-in that builds it on call.
Engine = importlib.import_module("sglang.srt.entrypoints.engine").Engine

VERSION = 3


def _release() -> tuple[int, ...]:
    return tuple(int(p) for p in sglang.__version__.split(".")[:3] if p.isdigit())


def _line() -> str:
    """The stand-in's release line for the installed SGLang."""
    return "0.5.21" if _release() >= (0, 5, 21) else "0.5.9"


def _source(module: str, qualname: str) -> str:
    """Source of a function in an SGLang module, read from its file (importing the scheduler
    needs a GPU stack); "" when absent."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(open(spec.origin).read())
    cls_name, _, fn_name = qualname.rpartition(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == fn_name:
                    return ast.get_source_segment(open(spec.origin).read(), item) or ""
    return ""


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
    with stop tokens, resumed), abort, export and import, load weights, release and resume
    memory, close."""
    from rlboost.models import build_tiny_checkpoint

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
    names = {name for name, _, _ in calls}
    assert {"async_generate", "update_weights_from_tensor", "flush_cache", "release_memory_occupation",
            "resume_memory_occupation", "shutdown"} <= names
    for name, args, kwargs in calls:
        method = getattr(Engine, name, None)
        assert callable(method), f"sglang {sglang.__version__}: Engine has no {name}()"
        inspect.signature(method).bind(None, *args, **kwargs)  # TypeError names what does not fit
    assert inspect.iscoroutinefunction(Engine.async_generate)


def test_attributes_the_adapter_reads_are_set_by_engine(asked):
    init = inspect.getsource(Engine.__init__)
    for name in {name for w, name, args in asked if w == "Engine" and args is None}:
        assert f"self.{name} =" in init, f"sglang {sglang.__version__}: Engine.__init__ sets no self.{name}"


def test_aborts_bind_to_the_tokenizer_managers_abort_request(asked):
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    calls = _calls(asked, "TokenizerManager")
    assert calls and {name for name, _, _ in calls} == {"abort_request"}
    for name, args, kwargs in calls:
        inspect.signature(TokenizerManager.abort_request).bind(None, *args, **kwargs)


def test_engine_kwargs_make_a_server_args(asked):
    from sglang.srt.server_args import ServerArgs

    (kwargs,) = [args[1] for w, name, args in asked if name == "__init__"]
    params = inspect.signature(ServerArgs).parameters
    assert set(kwargs) <= set(params), sorted(set(kwargs) - set(params))
    args = ServerArgs(**kwargs)
    assert args.skip_tokenizer_init is True and args.stream_interval == 2


def test_every_requests_sampling_params_pass_verify(asked):
    from sglang.srt.sampling.sampling_params import SamplingParams

    requests = [kwargs for name, _, kwargs in _calls(asked, "Engine") if name == "async_generate"]
    assert len(requests) >= 4
    for request in requests:
        params = SamplingParams(**request["sampling_params"])
        params.normalize(None)  # no tokenizer: skip_tokenizer_init
        params.verify(320)


def test_the_weight_update_session_is_where_the_adapter_expects_it(asked):
    has_session = callable(getattr(Engine, "begin_weight_update", None))
    assert has_session is (_release() >= (0, 5, 21))
    assert has_session is callable(getattr(Engine, "end_weight_update", None))
    control = [name for name, _, _ in _calls(asked, "Engine")
               if name in ("begin_weight_update", "update_weights_from_tensor", "end_weight_update")]
    updates = ["update_weights_from_tensor"] * control.count("update_weights_from_tensor")
    assert control == (["begin_weight_update", *updates, "end_weight_update"] if has_session else updates)
    if has_session:
        inspect.signature(Engine.begin_weight_update).bind(None)
        inspect.signature(Engine.end_weight_update).bind(None)


def test_engine_offers_no_pause_or_abort_call():
    for name in ("pause_generation", "continue_generation", "abort_request"):
        assert not hasattr(Engine, name), f"Engine.{name} exists now: the stand-in should offer it"


def test_the_stand_in_plays_the_installed_release():
    rules = RULES[_line()]
    manager = "sglang.srt.managers.tokenizer_manager"
    scheduler = "sglang.srt.managers.scheduler"
    assert hasattr(Engine, "begin_weight_update") is rules.weight_update_session
    if _release() in ((0, 5, 9), (0, 5, 21), (0, 5, 22), (0, 5, 23)):  # the lines' own sources
        assert ("abort_sent" in _source(manager, "TokenizerManager.abort_request")) is rules.abort_once_per_rid
        idle = _source(scheduler, "Scheduler.is_fully_idle")
        assert ("waiting_queue" in idle and "is_fully_idle" in _source(scheduler, "Scheduler.flush_cache")) \
            is rules.flush_counts_queued
    assert "startswith(recv_req.rid)" in textwrap.dedent(_source(scheduler, "Scheduler.abort_request"))
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    assert set(SERVER_ARGS) <= set(inspect.signature(ServerArgs).parameters)
    assert SAMPLING_KEYS <= set(inspect.signature(SamplingParams).parameters)
