"""The Python sandbox refuses what the model's code must not do, each in the kernel: the
network (a socket to a server listening on this machine), files outside its folder (a read
and a write), runaway time and runaway memory; and it runs ordinary code, whose files stay
in its folder for the episode's later calls."""

from __future__ import annotations

import socket

import pytest

from rlboost.environments import ModelTurn
from rlboost.environments.sandbox import PythonSandboxEnvironment, SandboxConfig, run_python
from rlboost.tasks.base import Problem

SLOW_START = 60.0  # time for ordinary code: interpreter start-up on a busy machine, never a measurement


def _run(code: str, folder, **limits):
    return run_python(code, folder, SandboxConfig(**{"time_s": SLOW_START, **limits}))


def test_ordinary_code_runs_confined_by_every_layer(tmp_path):
    run = _run("import json, math\nprint(json.dumps({'root': math.isqrt(144)}))", tmp_path)
    assert run.ok and run.stdout == '{"root": 12}\n'
    assert run.missing == ()
    assert {"resource limits", "network namespace", "seccomp"} <= set(run.layers)
    assert any(layer.startswith("landlock") for layer in run.layers)


def test_the_network_is_refused_even_to_a_server_on_this_machine(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=5)\nprint('connected')"
        run = _run(code, tmp_path)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected
    assert not run.ok and "connected" not in run.stdout
    assert "PermissionError" in run.stderr or "OSError" in run.stderr


def test_files_outside_the_folder_can_be_neither_read_nor_written(tmp_path):
    folder, outside = tmp_path / "episode", tmp_path / "secret.txt"
    folder.mkdir()
    outside.write_text("the answer key")
    read = _run(f"print(open({str(outside)!r}).read())", folder)
    write = _run(f"open({str(tmp_path / 'planted.txt')!r}, 'w').write('x')", folder)
    assert not read.ok and "the answer key" not in read.stdout and "PermissionError" in read.stderr
    assert not write.ok and "PermissionError" in write.stderr and not (tmp_path / "planted.txt").exists()


def test_runaway_time_is_stopped(tmp_path):
    spin = _run("while True:\n    pass", tmp_path, time_s=1.0)
    sleep = _run("import time\ntime.sleep(3600)", tmp_path, time_s=1.0)
    assert (spin.limit, sleep.limit) == ("time", "time")


def test_runaway_memory_is_stopped(tmp_path):
    run = _run("block = bytearray(1 << 30)\nprint('allocated')", tmp_path, memory_mb=128)
    grow = _run("blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 20))", tmp_path, memory_mb=128)
    assert (run.limit, grow.limit) == ("memory", "memory") and "allocated" not in run.stdout


def test_output_is_cut_to_its_bound(tmp_path):
    run = _run("print('x' * 100000)", tmp_path, max_output_bytes=100)
    assert run.ok and run.stdout == "x" * 100 + "\n[output cut]"


def test_an_episode_runs_the_code_a_turn_ends_with_and_keeps_its_files_between_calls():
    env = PythonSandboxEnvironment(SandboxConfig(time_s=SLOW_START))
    assert env.reset(Problem(problem_id=0, prompt="What is 6*7?", answer="42")) == "What is 6*7?"
    try:
        first = env.step(ModelTurn(text="Let me check.\n```python\nopen('n.txt', 'w').write(str(6*7))\n"
                                        "print(open('n.txt').read())\n```", token_ids=(1,)))
        second = env.step(ModelTurn(text="```python\nprint(int(open('n.txt').read()) + 1)\n```", token_ids=(2,)))
        failing = env.step(ModelTurn(text="```python\n1/0\n```", token_ids=(3,)))
        answer = env.step(ModelTurn(text="The answer is 42.", token_ids=(4,)))
    finally:
        folder = env.folder
        env.close()
    assert (first.observation, second.observation, first.done) == ("42", "43", False)
    assert failing.observation == "error: ZeroDivisionError: division by zero"
    assert answer.done and answer.observation == "" and env.calls == 3
    assert folder is not None and not __import__("os").path.exists(folder)
