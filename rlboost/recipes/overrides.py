"""`--set key=value` overrides applied to nested config dataclasses.

Keys are dotted paths through dataclass fields (`trainer.lr=3e-4`); values are parsed by
the field's annotated type, so a typo or a bad value fails before any process starts.
"""

from __future__ import annotations

import dataclasses
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


def parse_value(text: str, tp: Any, key: str) -> Any:
    """Parse `text` as a value of annotated type `tp` (str, int, float, bool, tuples, Optional)."""
    inner, nullable = _split_union(tp)
    if nullable and text.lower() in ("none", "null", ""):
        return None
    origin = typing.get_origin(inner)
    if origin is tuple:
        item_types = typing.get_args(inner)
        item_tp = item_types[0] if item_types else str
        parts = [p for p in text.split(",") if p.strip()] if text else []
        return tuple(parse_value(p.strip(), item_tp, key) for p in parts)
    if typing.get_origin(inner) is typing.Literal:
        allowed = typing.get_args(inner)
        if text not in allowed:
            raise ValueError(f"--set {key}: {text!r} is not one of {allowed}")
        return text
    try:
        if inner is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {text!r}")
        if inner is int:
            return int(text, 0)
        if inner is float:
            return float(text)
        if inner is str or inner is Any:
            return text
    except ValueError as exc:
        raise ValueError(f"--set {key}: cannot parse {text!r} as {getattr(inner, '__name__', inner)}: {exc}") from None
    raise ValueError(f"--set {key}: fields of type {tp} cannot be set from the command line")


def _field_types(obj: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(type(obj))
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(obj)}


def apply_override(config: Any, assignment: str) -> Any:
    """Return a copy of `config` with one `dotted.key=value` assignment applied."""
    if "=" not in assignment:
        raise ValueError(f"--set expects key=value, got {assignment!r}")
    key, text = assignment.split("=", 1)
    path = key.strip().split(".")
    return _apply(config, path, text.strip(), key.strip())


def _apply(obj: Any, path: list[str], text: str, key: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"--set {key}: {type(obj).__name__} has no fields")
    types = _field_types(obj)
    head = path[0]
    if head not in types:
        raise ValueError(f"--set {key}: unknown field {head!r}; known: {', '.join(sorted(types))}")
    current = getattr(obj, head)
    if len(path) == 1:
        if dataclasses.is_dataclass(current):
            raise ValueError(f"--set {key}: {head!r} is a section; set one of its fields")
        value = parse_value(text, types[head], key)
    else:
        value = _apply(current, path[1:], text, key)
    try:
        return dataclasses.replace(obj, **{head: value})
    except ValueError as exc:  # a section's own check: say which --set it refused
        raise ValueError(f"--set {key}: {exc}") from None


def apply_overrides(config: Any, assignments: list[str] | tuple[str, ...]) -> Any:
    """Apply several `--set` assignments in order."""
    for assignment in assignments:
        config = apply_override(config, assignment)
    return config


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
    """Rebuild a nested config dataclass from to_dict's output (unknown keys are refused)."""
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
            values[name] = from_dict(tp, value)
        elif typing.get_origin(tp) is tuple and isinstance(value, list):
            values[name] = tuple(value)
        else:
            values[name] = value
    return cls(**values)
