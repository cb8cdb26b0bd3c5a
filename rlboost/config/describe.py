"""Every field of a nested config, with its value, type and meaning, read from the config
dataclasses themselves (a field's meaning is the string literal written under it), so
`rlboost config` cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(frozen=True, slots=True)
class FieldDoc:
    """One settable field: its dotted path (what --set takes), value, type and meaning."""

    path: str
    value: Any
    type_name: str
    meaning: str


def describe(config: Any, prefix: str = "") -> Iterator[FieldDoc]:
    """Every leaf field of a nested config dataclass, depth first in declaration order."""
    hints = typing.get_type_hints(type(config))
    docs = field_meanings(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = prefix + f.name
        if dataclasses.is_dataclass(value):
            yield from describe(value, path + ".")
        else:
            yield FieldDoc(path, value, type_name(hints.get(f.name, f.type)), docs.get(f.name, ""))


@functools.cache
def field_meanings(cls: type) -> dict[str, str]:
    """Field name -> the first line of the string literal right under its declaration
    (an attribute docstring), for `cls` and the dataclasses it inherits from."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (e.g. a frozen build): no meanings
            continue
        body = ast.parse(source).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                out[node.target.id] = " ".join(after.value.value.split())
    return out


def type_name(tp: Any) -> str:
    """A short readable name of an annotated type: int, float | None, tuple[str, ...]."""
    if isinstance(tp, type):
        return tp.__name__
    text = str(tp).replace("typing.", "")
    return text.replace("NoneType", "None")


def format_table(rows: list[FieldDoc]) -> str:
    """The fields as aligned text: path = value  (type)  meaning."""
    shown = [(r.path, _show(r.value), r.type_name, r.meaning) for r in rows]
    w_path = max((len(p) for p, *_ in shown), default=0)
    w_value = min(28, max((len(v) for _, v, *_ in shown), default=0))
    w_type = max((len(t) for *_, t, _ in shown), default=0)
    lines = []
    for path, value, tp, meaning in shown:
        lines.append(f"{path:<{w_path}} = {value:<{w_value}}  {tp:<{w_type}}  {meaning}".rstrip())
    return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return "<secret>"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) or "''"
    return str(value)
