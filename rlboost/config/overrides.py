"""`--set key=value` overrides applied to nested config dataclasses.

Keys are dotted paths through dataclass fields (`trainer.optimizer.lr=3e-4`); values are
parsed by the field's annotated type, so a typo or a bad value fails before any process
starts. A config class may list fields that moved (`renamed_fields`: old dotted path, or
old prefix ending in ".", to the new one); old keys, and old config.json files, still work.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import types
import typing
from typing import Any


def _split_union(tp: Any) -> tuple[Any, bool]:
    """Return (inner type, allows None) for `X | None` / Optional[X]; else (tp, False)."""
    args = typing.get_args(tp)
    if args and type(None) in args and typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def parse_value(text: str, tp: Any, key: str, example: Any = None) -> Any:
    """Parse `text` as a value of annotated type `tp` (str, int, float, bool, tuples,
    Optional). ValueError saying the field, the type it expects and an example."""
    inner, nullable = _split_union(tp)
    if nullable and text.lower() in ("none", "null", ""):
        return None
    origin = typing.get_origin(inner)
    if origin is tuple:
        item_types = typing.get_args(inner)
        item_tp = item_types[0] if item_types else str
        parts = [p for p in text.split(",") if p.strip()] if text else []
        return tuple(parse_value(p.strip(), item_tp, key, example) for p in parts)
    if origin in (dict, collections.abc.Mapping) or inner in (dict, collections.abc.Mapping):
        try:
            value = json.loads(text) if text else {}
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"--set {key}={text}: expected a JSON object, e.g. {key}='{{\"name\": 1}}'")
        return value
    if origin is typing.Literal:
        allowed = typing.get_args(inner)
        if text not in allowed:
            raise ValueError(f"--set {key}={text}: expected one of {', '.join(map(str, allowed))}")
        return text
    value = _parse_scalar(text, inner)
    if value is _INVALID:
        kind = _KINDS.get(inner, getattr(inner, "__name__", str(inner)))
        also = " or none" if nullable else ""
        raise ValueError(f"--set {key}={text}: expected {kind}{also}, e.g. {key}={_example(inner, example)}")
    return value


_INVALID = object()


def _parse_scalar(text: str, tp: Any) -> Any:
    if tp is bool:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        return False if lowered in ("0", "false", "no", "off") else _INVALID
    try:
        if tp is int:
            return int(text, 0)
        if tp is float:
            return float(text)
    except ValueError:
        return _INVALID
    if tp is str or tp is Any:
        return text
    raise ValueError(f"fields of type {tp} cannot be set from the command line")


def _example(tp: Any, current: Any) -> str:
    if current is not None and not isinstance(current, tuple) and isinstance(current, tp):
        return str(current).lower() if tp is bool else str(current)
    return {bool: "true", int: "1", float: "0.5", str: "text"}.get(tp, "...")


def _field_types(obj: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(type(obj))
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(obj)}


def apply_overrides(config: Any, assignments: list[str] | tuple[str, ...]) -> Any:
    """Return a copy of `config` with `dotted.key=value` assignments applied (a later one
    wins). Each value is parsed by its field's type as it comes; each section's own checks
    run once, on all of its new values together, so fields that depend on each other
    (model.source=path with model.path=...) can be set in any order."""
    changes: dict[str, Any] = {}
    for assignment in assignments:
        if "=" not in assignment:
            raise ValueError(f"--set expects key=value, got {assignment!r}")
        key, text = (part.strip() for part in assignment.split("=", 1))
        key = current_path(type(config), key)
        _set_path(changes, key, _parse_at(config, key.split("."), text, key))
    return _rebuild(config, changes, "")


def current_path(cls: type, key: str) -> str:
    """Where the field an old dotted path named lives now (the path itself if it did not move)."""
    renamed = getattr(cls, "renamed_fields", {})
    if key in renamed:
        return renamed[key]
    for old, new in renamed.items():
        if old.endswith(".") and key.startswith(old):
            return new + key[len(old):]
    return key


def _parse_at(obj: Any, path: list[str], text: str, key: str) -> Any:
    """The value of `text` for the field at `path` under `obj` (ValueError naming the key)."""
    for depth, name in enumerate(path):
        if not dataclasses.is_dataclass(obj):
            raise ValueError(f"--set {key}: {'.'.join(path[:depth])} has no fields")
        types = _field_types(obj)
        if name not in types:
            raise ValueError(f"--set {key}: unknown field {name!r}; known: {', '.join(sorted(types))}")
        current = getattr(obj, name)
        if depth == len(path) - 1:
            if dataclasses.is_dataclass(current):
                raise ValueError(f"--set {key}: {name!r} is a section; set one of its fields")
            return parse_value(text, types[name], key, current)
        obj = current
    raise ValueError(f"--set expects key=value, got {key!r}")


class _Leaf:
    """A parsed value in a tree of changes (a dict there is a section; a field's value may
    be a dict too)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _set_path(tree: dict[str, Any], key: str, value: Any) -> None:
    *sections, name = key.split(".")
    for section in sections:
        tree = tree.setdefault(section, {})
    tree[name] = _Leaf(value)


def _rebuild(obj: Any, changes: dict[str, Any], prefix: str) -> Any:
    if not changes:
        return obj
    values = {name: sub.value if isinstance(sub, _Leaf) else _rebuild(getattr(obj, name), sub, f"{prefix}{name}.")
              for name, sub in changes.items()}
    try:
        return dataclasses.replace(obj, **values)
    except ValueError as exc:  # the section's own check: say which --set it refused
        keys = [prefix + name for name, sub in changes.items() if isinstance(sub, _Leaf)] or _leaves(changes, prefix)
        named = [k for k in keys if k in str(exc)] or keys  # the ones the check names, if any
        raise ValueError(f"--set {', '.join(named)}: {exc}") from None


def _leaves(changes: dict[str, Any], prefix: str) -> list[str]:
    """Every dotted key set under changes (a check across sections names no key of its own)."""
    return [k for name, sub in changes.items()
            for k in ([prefix + name] if isinstance(sub, _Leaf) else _leaves(sub, f"{prefix}{name}."))]


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a nested config (for the run directory's config.json).

    Bytes fields (shared secrets) are written as None: secrets never reach the disk, and
    a config read back takes them from the environment again.
    """
    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return None if isinstance(value, (bytes, bytearray)) else value

    return clean(dataclasses.asdict(config))


def from_dict(cls: Any, data: dict[str, Any]) -> Any:
    """Rebuild a nested config dataclass from to_dict's output (unknown keys are refused;
    fields the class lists as renamed are read from their old place too)."""
    if getattr(cls, "renamed_fields", None) and isinstance(data, dict):
        data = _moved(cls, data)
    return _from_dict(cls, data)


def _moved(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    """data with every field of an old layout at its current path. A dict is walked into
    when it is a section: a dataclass field, or an old section a renamed prefix names."""
    renamed = getattr(cls, "renamed_fields", {})
    tree: dict[str, Any] = {}

    def walk(klass: Any, node: dict, prefix: str) -> None:
        hints = typing.get_type_hints(klass) if klass is not None else {}
        for k, v in node.items():
            tp = _split_union(hints[k])[0] if k in hints else None
            section = dataclasses.is_dataclass(tp) or (tp is None and any(
                old.startswith(f"{prefix}{k}.") for old in renamed))
            if isinstance(v, dict) and section:
                walk(tp if dataclasses.is_dataclass(tp) else None, v, f"{prefix}{k}.")
            else:
                _set_path(tree, current_path(cls, prefix + k), v)

    walk(cls, data, "")
    return _unwrap(tree)


def _unwrap(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: v.value if isinstance(v, _Leaf) else _unwrap(v) for k, v in tree.items()}


def _from_dict(cls: Any, data: dict[str, Any]) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
    values = {}
    for name, value in data.items():
        tp, _ = _split_union(hints.get(name, fields[name].type))
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            values[name] = _from_dict(tp, value)
        elif typing.get_origin(tp) is tuple and isinstance(value, list):
            values[name] = tuple(value)
        else:
            values[name] = value
    return cls(**values)
