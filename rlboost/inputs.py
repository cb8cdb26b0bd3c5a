"""Files a user hands over (run directories, checkpoints, traces) are input, like frames off
a socket: JSON is read within a size and a nesting depth, names stay inside their folder,
and text is escaped before it reaches a terminal or a summary.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

MAX_JSON_BYTES = 64 << 20  # a config, a checkpoint's state, a trace: far below this
MAX_LINE_BYTES = 4 << 20   # one line of metrics.jsonl or events.jsonl
MAX_JSON_DEPTH = 64        # rlboost writes at most 5 levels


def parse_json(text: str | bytes, where: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, with a ValueError naming `where` for anything that is not JSON nested at
    most max_depth deep (Python's own parser gives up at its recursion limit, with a
    RecursionError that no caller expects)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise ValueError(f"{where}: not valid JSON ({' '.join(str(exc).split())[:160]})") from None
    if json_depth(value, max_depth) > max_depth:
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels")
    return value


def read_json(path: Path, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document of a file of at most max_bytes (ValueError naming the file)."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes:,} bytes")
    return parse_json(data, str(path), max_depth=max_depth)


def read_text(path: Path, *, max_bytes: int = MAX_JSON_BYTES) -> str:
    """A UTF-8 text file of at most max_bytes (undecodable bytes replaced); ValueError naming
    the file when it is longer."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes:,} bytes")
    return data.decode("utf-8", "replace")


def read_jsonl(path: Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; ValueError naming the file and line
    for a line that is too long, not JSON, or not a JSON object."""
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), 1):
            where = f"{path} line {number}"
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                raise ValueError(f"{where}: longer than {max_line_bytes:,} bytes")
            if not line.strip():
                continue
            record = parse_json(line, where)
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield number, record


def inside(folder: Path, name: object, what: str = "file") -> Path:
    """folder/name when name is a relative path that stays inside folder, symbolic links
    resolved; ValueError otherwise. The message names only `name`, never what lies
    outside (not even whether it exists)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"{what} name {printable(repr(name))} is not a file name")
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{what} {printable(repr(name))} leaves its folder {folder}")
    path = folder / rel
    if not path.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"{what} {printable(repr(name))} leads outside its folder {folder}")
    return path


def printable(text: object) -> str:
    """str(text) with every control or otherwise unprintable character (terminal escape
    sequences, bidirectional overrides, line breaks) written as a Python escape.

    >>> printable("ok \\x1b[31mred\\x1b[0m\\n")
    'ok \\\\x1b[31mred\\\\x1b[0m\\\\n'
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value (walked without recursion; stops past limit)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        todo.extend((child, depth + 1) for child in children)
    return deepest
