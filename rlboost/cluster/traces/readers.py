"""Readers of public spot-availability trace formats into an AvailabilityTrace: SkyPilot
spot-traces JSON (skypilot-org/spot-traces), SpotServe event CSV and its JSON-lines segments
(Hsword/SpotServe elastic-switch/trace), Bamboo step CSV (uclasystem/bamboo doc/data), and a
plain `time,count` CSV; the bundled samples of each format (synthetic, see data/README.md).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rlboost.cluster.traces.availability import AvailabilityTrace
from rlboost.inputs import parse_json, read_json

DATA = Path(__file__).parents[1] / "data"  # rlboost/cluster/data
SAMPLE_TRACE = DATA / "spot_sample.csv"
SAMPLES = {"sample": SAMPLE_TRACE, "skypilot-sample": DATA / "skypilot_sample.json",
           "spotserve-sample": DATA / "spotserve_sample.csv", "bamboo-sample": DATA / "bamboo_sample.csv",
           # measured, not synthetic: an excerpt of an AWS spot trace (see data/README.md)
           "aws-spot-4node": DATA / "skypilot_aws_us-east-2a_4node.json"}
MEASURED = ("aws-spot-4node",)


def read_skypilot_json(path: str | Path) -> AvailabilityTrace:
    """`{"metadata": {"gap_seconds": 300}, "data": [counts...]}` (skypilot-org/spot-traces)."""
    path = Path(path)
    try:
        doc = read_json(path)
        gap, data = float(doc["metadata"]["gap_seconds"]), doc["data"]
        counts = [int(c) for c in data]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a SkyPilot spot trace ({type(exc).__name__}: {exc})") from None
    if not counts:
        raise ValueError(f"{path}: empty data")
    return AvailabilityTrace.from_ticks(counts, gap, name=path.stem)


def _csv_rows(path: Path):
    line_no = 0
    try:
        with path.open(newline="") as f:
            for line_no, row in enumerate(csv.reader(f), 1):
                if row and not row[0].lstrip().startswith("#") and any(x.strip() for x in row):
                    yield line_no, [x.strip() for x in row]
    except (UnicodeDecodeError, csv.Error) as exc:  # binary bytes, NUL characters
        raise ValueError(f"{path} line {line_no + 1}: not a text CSV file ({exc})") from None


def _finish(path: Path, steps: list, duration_s: float | None, empty: str = "rows") -> AvailabilityTrace:
    """The trace of (time, count) steps read from path; errors name the file."""
    if not steps:
        raise ValueError(f"{path}: no {empty}")
    try:
        return AvailabilityTrace.from_steps(steps, duration_s, name=path.stem)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _time_count_steps(path: Path, columns: str, is_header, count) -> list[tuple[float, int]]:
    """Two-column `time,count` rows; the first may be a header (is_header(row)); count(text)
    parses the count. Any other bad row is one error naming its line and the columns."""
    steps = []
    for line_no, row in _csv_rows(path):
        if not steps and is_header(row):
            continue
        try:
            t, c = float(row[0]), count(row[1])
            if len(row) != 2 or t < 0 or c < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(f"{path} line {line_no}: expected '{columns}' with "
                             f"non-negative numbers, got {row}") from None
        steps.append((t, c))
    return steps


def read_count_csv(path: str | Path, duration_s: float | None = None) -> AvailabilityTrace:
    """`time,count` rows (seconds; optional header; `#` comments). The count is 0 before
    the first row; the last row's time ends the trace unless duration_s says otherwise."""
    path = Path(path)
    steps = _time_count_steps(path, "time,count", lambda row: row[:2] == ["time", "count"], int)
    return _finish(path, steps, duration_s)


def read_spotserve_csv(path: str | Path, duration_s: float | None = None) -> AvailabilityTrace:
    """`timestamp_ms,add|remove,nodeN` events (Hsword/SpotServe trace_full); count = nodes up."""
    path = Path(path)
    alive: set[str] = set()
    steps = []
    for line_no, row in _csv_rows(path):
        if len(row) != 3 or row[1] not in ("add", "remove") or not row[0].isdigit():
            raise ValueError(f"{path} line {line_no}: expected 'timestamp_ms,add|remove,node', "
                             f"got {row}")
        t, action, node = int(row[0]) / 1000.0, row[1], row[2]
        if (action == "add") == (node in alive):
            raise ValueError(f"{path} line {line_no}: {action} of node {node!r} that is "
                             f"{'already' if node in alive else 'not'} up")
        (alive.add if action == "add" else alive.remove)(node)
        steps.append((t, len(alive)))
    return _finish(path, steps, duration_s, empty="events")


def read_bamboo_csv(path: str | Path, duration_s: float | None = None) -> AvailabilityTrace:
    """Bamboo's step CSV: `seconds,available_instances` rows (a header naming them is optional;
    times may be fractional), the count holding from each time to the next."""
    path = Path(path)
    steps = _time_count_steps(path, "seconds,available_instances", lambda row: not _is_number(row[0]),
                              lambda text: int(float(text)))
    return _finish(path, steps, duration_s)


def read_spotserve_segment(path: str | Path) -> AvailabilityTrace:
    """A SpotServe trace segment: JSON lines `[t_ms, "add"|"remove", {"nodes": [...]}]`, ending
    with a `[t_ms, "DONE", ...]` line whose time ends the trace."""
    path = Path(path)
    alive: set[str] = set()
    steps, end = [], None
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file ({exc})") from None
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            t_ms, action, *more = parse_json(line, f"{path} line {line_no}")
            t = float(t_ms) / 1000.0
            if action == "DONE":
                end = t
                break
            nodes = more[0]["nodes"]
            if action not in ("add", "remove") or not isinstance(nodes, list):
                raise ValueError
        except (ValueError, TypeError, KeyError, IndexError):
            raise ValueError(f"{path} line {line_no}: expected [t_ms, \"add\"|\"remove\"|\"DONE\", "
                             f"{{\"nodes\": [...]}}], got {line[:80]!r}") from None
        for node in map(str, nodes):
            if (action == "add") == (node in alive):
                raise ValueError(f"{path} line {line_no}: {action} of node {node!r} that is "
                                 f"{'already' if node in alive else 'not'} up")
            (alive.add if action == "add" else alive.discard)(node)
        steps.append((t, len(alive)))
    return _finish(path, steps, end, empty="events")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


READERS = {"skypilot": read_skypilot_json, "counts": read_count_csv, "spotserve": read_spotserve_csv,
           "spotserve-segment": read_spotserve_segment, "bamboo": read_bamboo_csv}


def load_trace(path: str | Path, fmt: str = "auto") -> AvailabilityTrace:
    """Read any supported format (READERS) or "auto": .json is SkyPilot, .jsonl/.txt a SpotServe
    segment, a CSV by its first row (add/remove events: SpotServe; a seconds,available_instances
    header: Bamboo; else time,count)."""
    path = Path(path)
    if fmt == "auto":
        fmt = _sniff(path)
    if fmt not in READERS:
        raise ValueError(f"fmt must be 'auto' or one of {tuple(READERS)}, got {fmt!r}")
    return READERS[fmt](path)


def _sniff(path: Path) -> str:
    if path.suffix == ".json":
        return "skypilot"
    if path.suffix in (".jsonl", ".txt"):
        return "spotserve-segment"
    first = next((row for _, row in _csv_rows(path)), [])
    if len(first) == 3 and first[1] in ("add", "remove"):
        return "spotserve"
    if first and first[0] in ("seconds", "time_s", "timestamp") and len(first) == 2 and first[1] != "count":
        return "bamboo"
    return "counts"


def sample_trace(name: str = "sample") -> AvailabilityTrace:
    """A bundled trace (rlboost/cluster/data, see README there): the synthetic samples "sample"
    (time,count), "skypilot-sample", "spotserve-sample" and "bamboo-sample", and the measured
    "aws-spot-4node" (9 hours of a 4-instance AWS spot trace, SkyPilot layout)."""
    if name not in SAMPLES:
        raise ValueError(f"sample trace must be one of {sorted(SAMPLES)}, got {name!r}")
    return load_trace(SAMPLES[name])
