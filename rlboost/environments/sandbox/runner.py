"""run_python: one piece of the model's code in a confined child process (see child.py for
the layers), bounded in wall-clock time here: past its time the child's whole process group
is killed. Output goes to files outside the sandbox's folder and is cut to a bound, so code
that prints without end costs at most its file size limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlboost.environments.sandbox.config import SandboxConfig
from rlboost.errors import SandboxUnavailable

CHILD = str(Path(__file__).resolve().with_name("child.py"))  # run by path, never imported here
TIME, MEMORY = "time", "memory"
EXIT_MEMORY, EXIT_UNCONFINED = 3, 4  # the child's own exit codes (handed to it with the limits)


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxRun:
    """What one run did: its output (cut to max_output_bytes), exit code, the limit that
    ended it ("time", "memory" or None) and the isolation layers that applied.

    >>> SandboxRun(stdout="4\\n", stderr="", exit_code=0, limit=None, layers=("resource limits",)).ok
    True
    """

    stdout: str
    stderr: str
    exit_code: int
    limit: str | None
    layers: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None


def run_python(code: str, folder: str | Path, config: SandboxConfig) -> SandboxRun:
    """Run code with folder as its working directory and only writable place; SandboxUnavailable
    when config.require_isolation and a layer cannot apply here."""
    limits = {"memory_mb": config.memory_mb, "cpu_s": int(config.time_s) + 1, "file_mb": config.file_mb,
              "require": config.require_isolation, "exit_memory": EXIT_MEMORY, "exit_unconfined": EXIT_UNCONFINED}
    status_r, status_w = os.pipe()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", CHILD, str(folder), json.dumps(limits), str(status_w)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=folder, pass_fds=(status_w,),
                env={"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder), "LANG": "C.UTF-8"},
                start_new_session=True)
        finally:
            os.close(status_w)
        with os.fdopen(status_r) as status_file:
            limit = _feed_and_wait(proc, code.encode("utf-8", "replace"), config.time_s)
            status = _status(status_file.read())
        stdout, stderr = _read(out, config.max_output_bytes), _read(err, config.max_output_bytes)
    if proc.returncode == EXIT_UNCONFINED:
        raise SandboxUnavailable(f"the Python sandbox cannot confine code here ({'; '.join(status['missing'])}); "
                                 "install rlboost[sandbox] on a Linux kernel with Landlock and namespaces, or set "
                                 "environment.sandbox.require_isolation=false to run it with what applies")
    if limit is None and proc.returncode == EXIT_MEMORY:
        limit = MEMORY
    elif limit is None and proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        limit = TIME  # the kernel's CPU-time limit
    return SandboxRun(stdout=stdout, stderr=stderr, exit_code=proc.returncode, limit=limit,
                      layers=tuple(status["applied"]), missing=tuple(status["missing"]))


def _feed_and_wait(proc: subprocess.Popen, code: bytes, time_s: float) -> str | None:
    """Hand the code over, wait up to time_s, and kill the process group either way (code
    may leave processes behind). Returns "time" when the wait ran out."""
    limit = None
    try:
        proc.communicate(code, timeout=time_s)
    except subprocess.TimeoutExpired:
        limit = TIME
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return limit


def _status(text: str) -> dict:
    try:
        status = json.loads(text)
        return {"applied": list(status["applied"]), "missing": list(status["missing"])}
    except (ValueError, KeyError, TypeError):  # the child died before confining itself
        return {"applied": [], "missing": ["the child ended before it reported"]}


def _read(file, limit: int) -> str:
    file.seek(0)
    data = file.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + "\n[output cut]" if len(data) > limit else text
