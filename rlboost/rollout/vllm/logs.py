"""vLLM's failures in its own words. Its engine core and workers run in processes of their
own, and a failed start or a fatal error reaches the adapter only as "Engine core
initialization failed. See root cause above": the cause is in those processes' log. So
they also write their errors to a file the adapter reads back (vLLM's own logging config,
plus one file handler, through VLLM_LOGGING_CONFIG_PATH, which its processes read at start).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

_HANDLER = "rlboost_errors"
_RECORD = re.compile(r"^(ERROR|CRITICAL) ", re.M)


class ErrorLog:
    """A file vLLM's processes log their errors to, while they run.

    base: vLLM's logging config (vllm.logger.DEFAULT_LOGGING_CONFIG), kept as it is (the
    same console output) with one handler added for ERROR records. env() is what the
    processes must start with; last_error() the cause of the newest error, one line."""

    def __init__(self, base: Mapping[str, Any]):
        self.dir = Path(tempfile.mkdtemp(prefix="rlboost-vllm-log-"))
        self.path = self.dir / "errors.log"
        config = copy.deepcopy(dict(base))
        config.setdefault("formatters", {})[_HANDLER] = {"format": "%(levelname)s %(message)s"}
        config.setdefault("handlers", {})[_HANDLER] = {
            "class": "logging.FileHandler", "filename": str(self.path), "level": "ERROR",
            "formatter": _HANDLER, "delay": True}
        vllm_logger = config.setdefault("loggers", {}).setdefault("vllm", {"level": "INFO", "propagate": False})
        vllm_logger["handlers"] = [*vllm_logger.get("handlers", []), _HANDLER]
        self.config_path = self.dir / "logging.json"
        self.config_path.write_text(json.dumps(config))

    def env(self) -> dict[str, str]:
        return {"VLLM_LOGGING_CONFIG_PATH": str(self.config_path)}

    def last_error(self) -> str:
        """The newest error record's cause: its first exception that is more than a pointer
        to another log, as "Type: message"; else its message; "" when there is none."""
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return ""
        return cause_in(text)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def cause_in(text: str) -> str:
    """The cause in a log of ERROR records (see ErrorLog.last_error).

    >>> cause_in("ERROR EngineCore failed to start.\\nTraceback (most recent call last):\\n"
    ...          "  File \\"x.py\\", line 1, in f\\nValueError: head size 16 is not supported\\n")
    'ValueError: head size 16 is not supported'
    """
    starts = [m.start() for m in _RECORD.finditer(text)]
    if not starts:
        return ""
    record = text[starts[-1]:].splitlines()
    causes, in_traceback = [], False
    for line in record[1:]:  # each traceback ends in its exception's line, the first not indented
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and line.strip() and not line[0].isspace():
            causes.append(line.strip())
            in_traceback = False
    for cause in causes:  # a chain prints its innermost cause first
        if "root cause" not in cause.lower():
            return cause
    return record[0].partition(" ")[2].strip()
