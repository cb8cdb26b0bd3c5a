"""Reading a data set's own files (JSON lines, a JSON array, CSV) record by record, each
within bounds: a line of at most MAX_RECORD_BYTES (a longer one is skipped in pieces, never
held whole), UTF-8 text, JSON nested at most MAX_JSON_DEPTH deep. A record past a bound is
refused (Refusals) and the reading goes on; the caller decides what a file of nothing is.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import IO, Any, Iterator

from rlboost.inputs import MAX_JSON_DEPTH, json_depth, read_json
from rlboost.tasks.refusals import Refusals

MAX_RECORD_BYTES = 4 << 20  # one record of a data set (a problem and its solution): far below this
_SKIP_PIECE = 1 << 20
_INTEGER = re.compile(r"[-+]?\d{1,18}")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")

Record = tuple[str, dict[str, Any]]  # ("line 4", the record)


def bounded_lines(f: IO[bytes], max_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """(line number, the line's bytes) for every line; None for a line longer than max_bytes,
    whose rest is read past in pieces."""
    number = 0
    while line := f.readline(max_bytes + 1):
        number += 1
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = f.readline(_SKIP_PIECE)
            yield number, None
        else:
            yield number, line


def parse_record(line: bytes, refusals: Refusals, where: str) -> dict[str, Any] | None:
    """One JSON object from one line, or None (refused, with its cause)."""
    try:
        text = line.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        refusals.refuse(where, "not UTF-8", f"not UTF-8 (byte 0x{line[e.start]:02x} at offset {e.start})")
        return None
    try:
        value = json.loads(text)
    except RecursionError:
        refusals.refuse(where, "too deep", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return None
    except json.JSONDecodeError as e:
        refusals.refuse(where, "not JSON", f"not JSON ({e.msg} at column {e.colno})")
        return None
    except ValueError as e:  # an integer past Python's digit limit
        refusals.refuse(where, "number too long", " ".join(str(e).split())[:120])
        return None
    return checked_record(value, refusals, where)


def checked_record(value: Any, refusals: Refusals, where: str) -> dict[str, Any] | None:
    if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        refusals.refuse(where, "too deep", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return None
    if not isinstance(value, dict):
        refusals.refuse(where, "not an object", f"a JSON {type(value).__name__}, where a record is an object")
        return None
    return value


def read_json_lines(path: Path, refusals: Refusals) -> Iterator[Record]:
    with open(path, "rb") as f:
        for number, line in bounded_lines(f):
            where = f"line {number}"
            if line is None:
                refusals.refuse(where, "too long", f"longer than {MAX_RECORD_BYTES:,} bytes")
            elif line.strip():
                record = parse_record(line, refusals, where)
                if record is not None:
                    yield where, record


def read_json_file(path: Path, refusals: Refusals) -> Iterator[Record]:
    """A .json file: one array of records (within inputs.MAX_JSON_BYTES), or JSON lines."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"["):
        yield from read_json_lines(path, refusals)
        return
    for index, value in enumerate(read_json(path, max_depth=MAX_JSON_DEPTH + 1), 1):
        record = checked_record(value, refusals, f"item {index}")
        if record is not None:
            yield f"item {index}", record


def read_csv(path: Path, refusals: Refusals) -> Iterator[Record]:
    """Records of a CSV file with a header line; columns whose every value reads as an
    integer (or a number) are given as such, as the datasets library reads them."""
    rows, header = [], None
    with open(path, "rb") as f:
        reader = csv.reader(_text_lines(f, refusals), strict=True)
        csv.field_size_limit(MAX_RECORD_BYTES)
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                refusals.refuse(f"line {reader.line_num}", "not CSV", f"not CSV ({e})")
                continue
            where = f"line {reader.line_num}"
            if not fields or any("\udc80" <= c <= "\udcff" for field in fields for c in field):
                if fields:
                    refusals.refuse(where, "not UTF-8", "not UTF-8")
                continue
            if header is None:
                header = fields
            elif len(fields) != len(header):
                refusals.refuse(where, "not CSV", f"{len(fields)} fields, the header has {len(header)}")
            else:
                rows.append((where, fields))
    if header is None:
        return
    columns = [_typed([r[1][i] for r in rows]) for i in range(len(header))]
    for n, (where, _) in enumerate(rows):
        yield where, {name: column[n] for name, column in zip(header, columns)}


def _text_lines(f: IO[bytes], refusals: Refusals) -> Iterator[str]:
    for number, line in bounded_lines(f):
        if line is None:
            refusals.refuse(f"line {number}", "too long", f"longer than {MAX_RECORD_BYTES:,} bytes")
            yield "\n"  # an empty line, so the reader's line numbers stay the file's
        else:
            yield line.decode("utf-8", "surrogateescape").removeprefix("\ufeff")


def _typed(values: list[str]) -> list[Any]:
    present = [v for v in values if v != ""]
    if present and all(_INTEGER.fullmatch(v) for v in present):
        kind: type = int
    elif present and all(_FLOAT.fullmatch(v) for v in present):
        kind = float
    else:
        kind = str
    return [kind(v) if v != "" else None for v in values]
