"""Run directories and checkpoints a user is handed are input: every kind of damage or
crafting is one line and exit 2 from `rlboost train --resume` and `rlboost report`, no file
outside the run directory is read, written or described, and control characters in the
files never reach the terminal or summary.md. None of these starts Ray."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from test_cli_errors import _make_checkpoint, _make_run

from rlboost.cli import main
from rlboost.trainer.checkpoint import file_sizes

SECRET_SIZE = 123457  # a size no message may give away


@pytest.fixture
def user_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("RLBOOST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RLBOOST_RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RLBOOST_SET", raising=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s" * SECRET_SIZE)
    return tmp_path


def _restate(folder: Path, **changes) -> None:
    state = json.loads((folder / "state.json").read_text())
    state.update(changes)
    (folder / "state.json").write_text(json.dumps(state))


def _rewrite(folder: Path, name: str, data: bytes) -> None:
    """A file replaced with the sizes in state.json kept true, so only its content is wrong."""
    (folder / name).write_bytes(data)
    _restate(folder, files=file_sizes(folder))


def _craft(kind: str, run: Path, outside: Path) -> None:
    folder = _make_checkpoint(run, 2)
    if kind == "dotdot name":
        _restate(folder, files={"../../../outside/secret": SECRET_SIZE})
    elif kind == "absolute name":
        _restate(folder, files={str(outside / "secret"): SECRET_SIZE})
    elif kind == "linked file":
        (folder / "extra").symlink_to(outside / "secret")
        _restate(folder, files={"extra": SECRET_SIZE})
    elif kind == "linked model":
        os.rename(folder / "model", run / "elsewhere")
        (folder / "model").symlink_to(outside)
    elif kind == "linked checkpoint":
        (run / "checkpoints" / "step_000009").symlink_to(outside)
    elif kind == "deep state":
        (folder / "state.json").write_text("[" * 200_000)
    elif kind == "state types":
        _restate(folder, step="two", elapsed_s=-1)
    elif kind == "bad python rng":
        _restate(folder, python_rng=[3, [1, 2], "x"])
    elif kind == "bad rng pickle":
        _rewrite(folder, "rng_rank0.pt", os.urandom(3000))
    elif kind == "rng of another shape":
        torch.save({"format_version": 1, "torch": "nope"}, folder / "rng_rank0.pt")
        _restate(folder, files=file_sizes(folder))
    elif kind == "optimizer pickle":
        data = bytearray((folder / "optimizer.pt").read_bytes())
        at = data.find(b"data.pkl") + 40  # inside the pickle, the zip's directory left whole
        data[at:at + 8] = b"\xff" * 8
        _rewrite(folder, "optimizer.pt", bytes(data))
    elif kind == "deep config":
        (run / "config.json").write_text("{\"a\": " * 50_000)
    elif kind == "config types":
        (run / "config.json").write_text(json.dumps({"run": 5}))
    elif kind == "bad metrics line":
        (run / "metrics.jsonl").write_text('{"step": 1}\n{not json\n')
    elif kind == "metrics not objects":
        (run / "metrics.jsonl").write_text("[1, 2]\n")
    elif kind == "linked metrics":
        (run / "metrics.jsonl").symlink_to(outside / "secret")
    elif kind == "index outside":
        (folder / "model" / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"w": "../../../../outside/secret"}}))
        _restate(folder, files=file_sizes(folder))


KINDS = ["dotdot name", "absolute name", "linked file", "linked model", "linked checkpoint", "deep state",
         "state types", "bad python rng", "bad rng pickle", "rng of another shape", "optimizer pickle",
         "deep config", "config types", "bad metrics line", "metrics not objects", "linked metrics",
         "index outside"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_crafted_run_directory_is_one_line_and_exit_2_on_resume(user_env, capsys, kind):
    run, outside = _make_run(user_env), user_env / "outside"
    _craft(kind, run, outside)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in outside.iterdir())
    assert main(["train", "--resume", str(run)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert str(SECRET_SIZE) not in lines[0] and f"{SECRET_SIZE:,}" not in lines[0]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in outside.iterdir()) == before


def _reported_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "reported"
    run.mkdir(parents=True)
    for step in (1, 2):
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "reward_mean": 0.5, "samples": 4, "samples_trained": 4,
                                "samples_unique": 4, "total_tokens": 10, "rollout_time_s": 1.0,
                                "step_wall_s": 1.0, "elapsed_s": float(step)}) + "\n")
    return run


def test_control_characters_in_events_never_reach_the_terminal_or_the_summary(user_env, capsys):
    run = _reported_run(user_env)
    escape = "\x1b]0;owned\x07\x1b[2J\u202e"
    with open(run / "events.jsonl", "w") as f:
        f.write(json.dumps({"t": 0.5, "step": 1, "kind": "notice", "instance": "spot-0", "source": escape}) + "\n")
        f.write(json.dumps({"t": 0.6, "step": 1, "kind": "restart", "cause": f"[bold]x[/bold]{escape}"}) + "\n")
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr()
    summary = (run / "summary.md").read_text()
    for text in (out.out, out.err, summary):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b" in summary and "[bold]x[/bold]" in out.out  # escaped, and not read as markup


@pytest.mark.parametrize("kind", ["bad line", "deep line", "not an object", "no kind", "linked summary tmp",
                                  "linked plot", "linked plots"])
def test_report_of_a_crafted_directory_is_one_line_or_writes_only_inside_it(user_env, capsys, kind):
    run, outside = _reported_run(user_env), user_env / "outside"
    events = run / "events.jsonl"
    wrote_inside = False
    if kind == "bad line":
        events.write_text('{"t": 1, "kind": "join"}\n{"t": \n')
    elif kind == "deep line":
        events.write_text("[" * 100_000 + "\n")
    elif kind == "not an object":
        events.write_text('"join"\n')
    elif kind == "no kind":
        events.write_text('{"t": 1.0, "step": 1}\n')
    elif kind == "linked summary tmp":  # where a careless writer would put its temporary file
        (run / "summary.md.tmp").symlink_to(outside / "secret")
        (run / ".summary.md.tmp").symlink_to(outside / "secret")
        wrote_inside = True
    elif kind == "linked plot":
        (run / "plots").mkdir()
        (run / "plots" / "reward_throughput.png").symlink_to(outside / "secret")
        wrote_inside = True
    elif kind == "linked plots":
        (run / "plots").symlink_to(outside)
    before = (outside / "secret").read_bytes()
    code = main(["report", str(run)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    if wrote_inside:
        assert code == 0, err
    else:
        assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
        assert str(SECRET_SIZE) not in err[0]
    assert (outside / "secret").read_bytes() == before
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
