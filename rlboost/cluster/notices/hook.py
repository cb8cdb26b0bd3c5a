"""The shutdown hook's notice: `rlboost notice --grace S`, run on a node by its shutdown hook
(a Kubernetes preStop, a systemd unit, cloud-init), tells the run that this node goes away
in S seconds. Each node's notice agent listens on a Unix socket of its own in a folder only
its user may enter (the user's runtime folder, else rlboost-notices-UID in the temporary
folder); an agent refuses a folder that is not its user's or is open to others, and the
command checks the folder, the socket and the listening process's user before it speaks.
The command sends one JSON line and reads the agent's answers: the run took the notice (at
once), and, with --wait, its instances have drained.

    request  {"format_version": 1, "grace_s": 20.0, "wait": true}
    answers  {"format_version": 1, "taken": true}   then, with wait, {"format_version": 1, "drained": true}
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlboost import env
from rlboost.cluster.notices.base import SOCKET_NAME_BYTES, Notice

HOOK_FORMAT_VERSION = 1
MAX_LINE = 4096
READ_TIMEOUT_S = 5.0  # a client that sends no whole line within this is dropped
TAKE_TIMEOUT_S = 5.0  # how long an agent waits for the run to take a hook's notice before it says so
MAX_GRACE_S = 24 * 3600.0
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path holds 108 with its NUL)
SOCKET_NAME = SOCKET_NAME_BYTES
log = logging.getLogger(__name__)


def candidate_folders() -> list[Path]:
    """Where nodes' notice sockets go on this machine, in the order an agent picks: the
    user's runtime folder (XDG_RUNTIME_DIR, or /run/user/UID) when it is the user's own and
    closed; else rlboost-notices-UID in the temporary folder, or in /tmp when that path is
    too long for a socket."""
    uid = os.getuid()
    runtime = env.runtime_dir() or f"/run/user/{uid}"
    folders = [Path(runtime) / "rlboost-notices"] if _is_private(Path(runtime)) else []
    folders += [Path(tempfile.gettempdir()) / f"rlboost-notices-{uid}", Path("/tmp") / f"rlboost-notices-{uid}"]
    return [f for f in dict.fromkeys(folders) if len(os.fsencode(f)) + SOCKET_NAME <= MAX_SOCKET_PATH]


def default_hook_dir() -> Path:
    return candidate_folders()[0]


def socket_path(folder: str | os.PathLike | None, node_id: str) -> Path:
    """The notice socket of a node (its id's first 16 hex digits: a Unix socket path is
    short); ValueError when the folder's path leaves no room for it."""
    path = Path(folder or default_hook_dir()) / f"{node_id[:16]}.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"cluster.notices.hook_dir: the notice socket {path} would be {len(os.fsencode(path))} "
                         f"bytes, over the {MAX_SOCKET_PATH} a Unix socket allows; name a shorter folder")
    return path


def _is_private(folder: Path) -> bool:
    try:
        info = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def private_folder(folder: Path, create: bool = True) -> Path:
    """Create the folder (mode 0700) or check an existing one: it must be ours and closed to
    others, or anyone on the machine could announce a node's end or listen in its place.
    PermissionError (one line) otherwise."""
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _is_private(folder):
        raise PermissionError(f"{folder} must be a folder (not a link) of user {os.getuid()}, closed to others "
                              "(mode 0700): another user may have made it; remove it, or set "
                              "cluster.notices.hook_dir (and `rlboost notice --dir`) to a folder of yours")
    return folder


@dataclass(slots=True)
class _Pending:
    notice: Notice
    received: float  # time.monotonic() on this node
    taken: threading.Event
    drained: threading.Event


class HookListener:
    """Accepts `rlboost notice` on the node's socket; on_notice(pending) queues each one."""

    def __init__(self, path: Path, on_notice: Callable[[_Pending], None]):
        self.path = path
        self.on_notice = on_notice
        private_folder(path.parent)
        path.unlink(missing_ok=True)  # left by an agent that was killed
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        os.chmod(path, 0o600)
        self._server.listen(16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="notice-hook", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = _read_request(conn)
            except (OSError, ValueError) as exc:
                _send(conn, {"error": str(exc)})
                return
            pending = _Pending(Notice(source="hook", grace_s=request["grace_s"], detail="rlboost notice"),
                               time.monotonic(), threading.Event(), threading.Event())
            self.on_notice(pending)
            if not pending.taken.wait(TAKE_TIMEOUT_S):
                _send(conn, {"taken": False, "error": f"no run took the notice within {TAKE_TIMEOUT_S:g} s; "
                                                      "it waits on the node for the run"})
                return
            _send(conn, {"taken": True})
            if request["wait"]:
                pending.drained.wait(max(0.0, request["grace_s"] - (time.monotonic() - pending.received)))
                _send(conn, {"drained": pending.drained.is_set()})

    def close(self) -> None:
        self._stop.set()
        try:
            self._server.close()
        finally:
            self.path.unlink(missing_ok=True)


def _read_request(conn: socket.socket) -> dict:
    conn.settimeout(READ_TIMEOUT_S)
    data = b""
    deadline = time.monotonic() + READ_TIMEOUT_S
    while b"\n" not in data:
        if len(data) > MAX_LINE or time.monotonic() > deadline:
            raise ValueError(f"a notice request is one JSON line under {MAX_LINE} bytes")
        chunk = conn.recv(MAX_LINE)
        if not chunk:
            break
        data += chunk
    try:
        request = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        raise ValueError("a notice request is one JSON line") from None
    if not isinstance(request, dict) or request.get("format_version") != HOOK_FORMAT_VERSION:
        raise ValueError(f"a notice request carries format_version {HOOK_FORMAT_VERSION}")
    grace = request.get("grace_s")
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= MAX_GRACE_S:
        raise ValueError(f"grace_s must be a number of seconds in [0, {MAX_GRACE_S:g}], got {grace!r}")
    return {"grace_s": float(grace), "wait": bool(request.get("wait", False))}


def _send(conn: socket.socket, answer: dict) -> None:
    try:
        conn.sendall(json.dumps({"format_version": HOOK_FORMAT_VERSION, **answer}).encode() + b"\n")
    except OSError:  # the command gave up: nothing to tell
        pass


# -- the command's side --------------------------------------------------------------------


def node_sockets(folder: str | os.PathLike | None) -> list[Path]:
    """The notice sockets of the runs' nodes on this machine: in `folder`, or in every
    candidate folder that is the user's own (PermissionError for a named folder that is not)."""
    if folder is not None:
        where = Path(folder)
        if not where.exists():
            return []
        _folder_owner(where)
        return sorted(where.glob("*.sock"))
    return sorted(p for f in candidate_folders() if _is_private(f) for p in f.glob("*.sock"))


def pick_socket(folder: str | os.PathLike | None, node: str | None) -> Path:
    """The socket of the one node on this machine (or of the node whose id starts with `node`);
    ValueError saying what is there otherwise."""
    found = [p for p in node_sockets(folder) if node is None or p.stem.startswith(node[:16])]
    if not found:
        named = f" for node {node}" if node else ""
        where = folder or " or ".join(str(f) for f in candidate_folders())
        raise ValueError(f"no rlboost run listens for notices on this machine{named} (no socket in {where})")
    if len(found) > 1:
        raise ValueError(f"{len(found)} Ray nodes of rlboost runs on this machine ({', '.join(p.stem for p in found)}): "
                         "name one with --node")
    return found[0]


def send_notice(path: Path, grace_s: float, wait: bool = False) -> dict:
    """Announce this node's end in grace_s seconds; returns the agent's answers merged
    ({"taken": bool, "drained": bool with wait}). PermissionError when the socket, its
    folder or the process listening on it is not the user's; OSError when no agent listens
    there or it answers what an agent does not."""
    owner = _check_socket(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(TAKE_TIMEOUT_S + 5.0)
        conn.connect(str(path))
        _check_peer(conn, path, owner)
        conn.sendall(json.dumps({"format_version": HOOK_FORMAT_VERSION, "grace_s": grace_s, "wait": wait}).encode()
                     + b"\n")
        answers = _read_answers(conn, grace_s, wait)
    if not answers:
        raise OSError(f"the notice agent at {path} closed the connection without an answer")
    return {k: v for a in answers for k, v in a.items()}


def _read_answers(conn: socket.socket, grace_s: float, wait: bool) -> list[dict]:
    answers: list[dict] = []
    reader = conn.makefile("rb")
    for _ in range(2 if wait else 1):
        if wait and answers and answers[-1].get("taken"):
            conn.settimeout(grace_s + 5.0)
        line = reader.readline(MAX_LINE)
        if not line:
            break
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise OSError(f"the notice agent answered what is not an answer: {line[:80]!r}")
        answers.append(answer)
        if not answer.get("taken", True) or "error" in answer:
            break
    return answers


def _folder_owner(folder: Path) -> int:
    """The user a socket folder belongs to: the caller, or anyone for root (a shutdown hook
    that runs as root names the run's folder); PermissionError when it is not a folder of
    such a user closed to others."""
    info = folder.lstat()
    me = os.getuid()
    if not stat.S_ISDIR(info.st_mode) or info.st_mode & 0o077 or (info.st_uid != me and me != 0):
        raise PermissionError(f"{folder} must be a folder (not a link) of user {me}, closed to others (mode 0700): "
                              "another user may have made it; the notice was not sent")
    return info.st_uid


def _check_socket(path: Path) -> int:
    """The folder's owner, when the socket is a socket of that user in a folder trusted."""
    owner = _folder_owner(path.parent)
    info = path.lstat()
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != owner:
        raise PermissionError(f"{path} is not a socket of user {owner}; the notice was not sent")
    return owner


def _check_peer(conn: socket.socket, path: Path, owner: int) -> None:
    """The process listening is the folder's user's (Linux: SO_PEERCRED; elsewhere the
    folder's check stands alone)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != owner:
        raise PermissionError(f"the process listening on {path} is user {uid}'s, not user {owner}'s; "
                              "the notice was not sent")
