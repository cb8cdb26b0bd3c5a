"""The shutdown hook's socket lives where only the run's user can put one: a node's agent
refuses a folder that others may enter or write, `rlboost notice` checks the folder and the
listener's user before it sends, and exits 0 only when the run itself took the notice (and,
with --wait, drained). The default folder holds a socket path short enough for AF_UNIX
even under a long TMPDIR."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from rlboost.cli import main
from rlboost.cluster.notices.agent import NodeNoticeAgent
from rlboost.cluster.notices.base import NoticeConfig
from rlboost.cluster.notices.hook import HookListener, default_hook_dir, send_notice, socket_path

NODE = "ab" * 28


class SquatterForTests:
    """A listener that answers every request as a run would ("taken", "drained"): what
    another local user could leave in a folder the run did not make."""

    def __init__(self, path):
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.heard: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                self.heard.append(conn.recv(4096))
                conn.sendall(b'{"format_version": 1, "taken": true}\n{"format_version": 1, "drained": true}\n')

    def close(self):
        self.server.close()


@pytest.fixture
def short_tmp():
    """A folder with a short path (pytest's own may be too long for a Unix socket)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlb-", dir="/tmp") as folder:
        yield folder


def _squatted(folder) -> SquatterForTests:
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o777)  # a folder others may write: as if someone else had made it
    return SquatterForTests(socket_path(folder, NODE))


def test_rlboost_notice_refuses_a_socket_in_a_folder_others_may_write(short_tmp, capsys):
    folder = os.path.join(short_tmp, "notices")
    squatter = _squatted(folder)
    try:
        code = main(["notice", "--grace", "25", "--wait", "--dir", folder])
    finally:
        squatter.close()
    err = capsys.readouterr()
    assert code != 0 and "took the notice" not in err.out
    assert "0700" in err.err and not squatter.heard  # refused before connecting


def test_a_node_agent_refuses_to_start_in_a_folder_others_may_write(short_tmp):
    folder = os.path.join(short_tmp, "notices")
    squatter = _squatted(folder)
    try:
        with pytest.raises(PermissionError, match="0700"):
            NodeNoticeAgent(NoticeConfig(hook_dir=folder), "none", NODE)
    finally:
        squatter.close()


def test_rlboost_notice_fails_unless_the_run_took_the_notice_and_drained(short_tmp, capsys):
    folder = os.path.join(short_tmp, "notices")
    taken_only = HookListener(socket_path(folder, NODE), lambda pending: pending.taken.set())
    try:
        assert main(["notice", "--grace", "0.5", "--wait", "--dir", folder]) == 3  # taken, never drained
        assert "not drained" in capsys.readouterr().err
        assert main(["notice", "--grace", "5", "--dir", folder]) == 0  # taken is all it asked
    finally:
        taken_only.close()
    silent = HookListener(socket_path(folder, NODE), lambda pending: None)  # nobody takes it
    try:
        assert main(["notice", "--grace", "5", "--dir", folder]) == 3
    finally:
        silent.close()


def test_the_hook_s_answer_comes_from_a_process_of_the_same_user(short_tmp):
    folder = os.path.join(short_tmp, "notices")
    listener = HookListener(socket_path(folder, NODE), lambda p: (p.taken.set(), p.drained.set()))
    try:
        assert send_notice(listener.path, 3.0, wait=True) == {"format_version": 1, "taken": True, "drained": True}
    finally:
        listener.close()


def test_the_default_folder_fits_a_unix_socket_under_a_long_tmpdir(tmp_path, monkeypatch):
    import tempfile

    long_tmp = tmp_path / ("t" * 60) / ("u" * 60)
    long_tmp.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again
    path = socket_path(None, NODE)
    assert len(os.fsencode(path)) < 108
    listener = HookListener(path, lambda p: (p.taken.set(), p.drained.set()))
    try:
        assert send_notice(path, 2.0)["taken"] is True
    finally:
        listener.close()


def test_the_default_folder_is_the_user_s_runtime_folder_when_there_is_one(short_tmp, monkeypatch):
    runtime = os.path.join(short_tmp, "run-user")
    os.mkdir(runtime, 0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    assert str(default_hook_dir()).startswith(runtime)
    os.chmod(runtime, 0o755)  # not private: not taken
    assert not str(default_hook_dir()).startswith(runtime)



def test_a_hook_dir_too_long_for_a_unix_socket_is_refused_in_the_config():
    with pytest.raises(ValueError, match="cluster.notices.hook_dir"):
        NoticeConfig(hook_dir="/tmp/" + "d" * 100)
