"""rlboost/_C.pyi matches rlboost._C: the same names, each of the same kind (function,
class or value), classes with the same members, and keyword-only constructors that take
the keywords the stub lists."""

import ast
import inspect
import pathlib

import pytest

import rlboost
from rlboost import _C

STUB = pathlib.Path(rlboost.__file__).with_name("_C.pyi")
BUILT_ONLY_WITH_UCX = {"ucx_service_stats"}


def _stub_scope(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    out = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


STUB_TOP = _stub_scope(ast.parse(STUB.read_text()).body)
HELPERS = {n for n, node in STUB_TOP.items() if isinstance(node, ast.ClassDef) and n.startswith("_")}


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("__") and n != "_pybind11_conduit_v1_"}


def _kind(node: ast.stmt) -> str:
    return {ast.FunctionDef: "function", ast.ClassDef: "class", ast.AnnAssign: "value"}[type(node)]


def _runtime_kind(obj) -> str:
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else "value"


def test_every_stub_name_is_in_the_module_and_the_other_way_round():
    stub = set(STUB_TOP) - HELPERS
    module = _public(_C)
    if not _C.HAS_UCX:
        stub -= BUILT_ONLY_WITH_UCX
    assert stub - module == set(), "in the stub, not in rlboost._C"
    assert module - stub == set(), "in rlboost._C, not in the stub"


@pytest.mark.parametrize("name", sorted(set(STUB_TOP) - HELPERS - BUILT_ONLY_WITH_UCX))
def test_each_name_has_the_same_kind_and_members(name):
    node, obj = STUB_TOP[name], getattr(_C, name)
    if name == "migration":
        helper = STUB_TOP["_Migration"]
        members = _stub_scope(helper.body)
        assert set(members) == _public(obj)
        for m, member in members.items():
            assert _kind(member) == _runtime_kind(getattr(obj, m)), m
        return
    assert _kind(node) == _runtime_kind(obj)
    if isinstance(node, ast.ClassDef):
        members = {n for n in _stub_scope(node.body) if n != "__init__"}
        assert members == _public(obj), name


@pytest.mark.parametrize("name", [n for n, node in STUB_TOP.items() if isinstance(node, ast.ClassDef)
                                  and "__init__" in _stub_scope(node.body)])
def test_constructors_take_the_stub_keywords_only(name):
    init = _stub_scope(STUB_TOP[name].body)["__init__"]
    keywords = [a.arg for a in init.args.kwonlyargs]
    assert not init.args.args[1:], f"{name}: the stub lists positional parameters"
    doc = getattr(_C, name).__init__.__doc__
    assert f"(self: rlboost._C.{name}, *, " in doc
    for k in keywords:
        assert f" {k}: " in doc, f"{name}: no keyword {k}"
