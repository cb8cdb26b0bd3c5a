"""What `rlboost train` says when it cannot run: one or two lines naming what is wrong and
what to do, a documented exit code, no traceback, and no run directory left behind by a
launch that never reached its first step. None of these starts Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlboost.cli import main
from rlboost.config.overrides import to_dict
from rlboost.errors import CheckpointError
from rlboost.models.checkpoint import build_tiny_checkpoint
from rlboost.recipes import get_recipe
from rlboost.trainer.checkpoint import choose_resume_point, file_sizes


@pytest.fixture
def user_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("RLBOOST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RLBOOST_RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RLBOOST_SET", raising=False)
    return tmp_path


def _lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _make_checkpoint(run: Path, step: int, *, complete: bool = True) -> Path:
    """A checkpoint folder as the trainer writes one (model, optimizer, state with sizes)."""
    folder = run / "checkpoints" / f"step_{step:06d}"
    build_tiny_checkpoint(folder / "model", hidden_size=16, intermediate_size=32, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=8)
    torch.save({"optimizer": {"state": {}, "param_groups": []}}, folder / "optimizer.pt")
    state = {"step": step, "weight_version": step + 1, "elapsed_s": 1.0, "python_rng": None,
             "files": file_sizes(folder)}
    (folder / "state.json").write_text(json.dumps(state))
    if complete:
        (folder / "COMPLETE").write_text("")
    return folder


def _make_run(tmp_path: Path, steps: int = 10) -> Path:
    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    config = to_dict(get_recipe("tiny_cpu"))
    config["run"]["steps"] = steps
    (run / "config.json").write_text(json.dumps(config))
    return run


@pytest.mark.parametrize("assignment, expected", [
    ("run.steps=abc", "--set run.steps=abc: expected an integer, e.g. run.steps=60"),
    ("run.progress=maybe", "--set run.progress=maybe: expected true or false, e.g. run.progress=true"),
    ("trainer.lr=7", "--set trainer.optimizer.lr: lr must be in (0, 1), got 7.0"),  # an old path
    ("run.stepz=3", "unknown field 'stepz'"),
])
def test_a_bad_setting_is_one_line_naming_the_field_and_what_it_takes(user_env, capsys, assignment, expected):
    assert main(["train", "--set", assignment]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and expected in lines[0]
    assert not (user_env / "runs").exists()


def test_settings_from_the_environment_are_checked_the_same_way(user_env, monkeypatch, capsys):
    monkeypatch.setenv("RLBOOST_SET", "run.progress=false run.steps=-1")
    assert main(["train"]) == 2
    assert _lines(capsys) == ["rlboost train: --set run.steps: run.steps must be in [1, 1e7], got -1"]


def test_a_missing_model_path_is_refused_before_anything_starts(user_env, capsys):
    assert main(["train", "--set", "model.source=path", "--set", f"model.path={user_env}/nowhere"]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "model.path" in lines[0] and "config.json" in lines[0]
    assert not (user_env / "runs").exists()


def test_a_launch_that_fails_before_its_first_step_leaves_no_run_directory(user_env, capsys):
    # the tiny model's byte tokenizer has no chat template
    assert main(["train", "--set", "model.warmup_steps=0", "--set", "task.chat_template=true"]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "chat template" in lines[0], lines
    assert list((user_env / "runs").iterdir()) == []


def test_resume_without_a_complete_checkpoint_says_so(user_env, capsys):
    run = _make_run(user_env)
    _make_checkpoint(run, 5, complete=False)
    assert main(["train", "--resume", str(run)]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "no complete checkpoint" in lines[0] and "step_000005" in lines[0]


@pytest.mark.parametrize("victim", ["optimizer.pt", "model/model.safetensors"])
def test_a_truncated_checkpoint_file_is_named_before_ray_starts(user_env, capsys, victim):
    run = _make_run(user_env)
    _make_checkpoint(run, 2)
    folder = _make_checkpoint(run, 4)
    path = folder / victim
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(["train", "--resume", str(run)]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1, lines
    assert "step_000004 is damaged" in lines[0] and victim.split("/")[-1] in lines[0]
    assert "delete it to resume from step_000002" in lines[0]


def test_resume_passes_over_an_interrupted_save_and_says_why(tmp_path):
    run = _make_run(tmp_path)
    _make_checkpoint(run, 2)
    _make_checkpoint(run, 4, complete=False)
    point = choose_resume_point(run / "checkpoints")
    assert point.step == 2 and point.path.name == "step_000002"
    assert point.skipped == ("step_000004 has no COMPLETE marker: its save was interrupted",)


def test_a_damaged_state_file_is_a_checkpoint_error(tmp_path):
    run = _make_run(tmp_path)
    folder = _make_checkpoint(run, 3)
    (folder / "state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="state.json is damaged"):
        choose_resume_point(run / "checkpoints")


def test_resuming_a_finished_run_says_how_to_train_on(user_env, capsys):
    run = _make_run(user_env, steps=4)
    _make_checkpoint(run, 4)
    assert main(["train", "--resume", str(run)]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "has trained 4 steps" in lines[0] and "--set run.steps=8" in lines[0]


def test_resuming_with_fewer_steps_than_were_trained_says_how_many_were(user_env, capsys):
    run = _make_run(user_env, steps=20)
    _make_checkpoint(run, 20)
    assert main(["train", "--resume", str(run), "--set", "run.steps=5"]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "has trained 20 steps" in lines[0] and "run.steps is 5" in lines[0], lines
    assert "finished its 5 steps" not in lines[0]


def test_debug_shows_the_traceback_and_keeps_the_exit_code(user_env, capsys):
    assert main(["train", "--debug", "--set", "run.steps=abc"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("rlboost train: --set run.steps=abc")


def test_config_lists_every_field_with_its_type(capsys):
    assert main(["config", "--set", "run.steps=7"]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = next(line for line in out if line.startswith("run.steps "))
    assert steps.split()[1:4] == ["=", "7", "int"]
    assert any(line.startswith("transfer.chunk_bytes ") for line in out)
    assert any(line.startswith("controller.registry.drain_margin_s ") for line in out)


def test_the_installed_command_prints_no_traceback(user_env):
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(user_env / "runs"))
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", "--set", "run.steps=x"],
                          cwd=user_env, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "rlboost train: --set run.steps=x: expected an integer, e.g. run.steps=60"]


def _one_line_exit_2(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("name, content", [
    ("missing.json", None),
    ("random.json", bytes(range(256)) * 3),
    ("random.csv", bytes(range(256)) * 3),
    ("empty.json", b""),
    ("shape.json", b'{"foo": 1}'),
    ("list.json", b"[1, 2, 3]"),
    ("deep.json", b"[" * 100_000),
    ("rows.csv", b"time,count\n0,1\n5,many\n"),
])
def test_a_bad_trace_file_is_one_line_before_anything_starts(user_env, capsys, name, content):
    path = user_env / name
    if content is not None:
        path.write_bytes(content)
    line = _one_line_exit_2(["train", "--set", f"cluster.trace={path}"], capsys)
    assert name in line
    assert not (user_env / "runs").exists()


def test_a_run_root_that_is_a_regular_file_is_one_line(user_env, monkeypatch, capsys):
    (user_env / "afile").write_text("")
    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(user_env / "afile" / "runs"))
    line = _one_line_exit_2(["train", "--set", "run.steps=1"], capsys)
    assert "RLBOOST_RUN_ROOT" in line and "afile" in line


def test_a_run_root_on_a_read_only_mount_is_one_line(user_env):
    """A real read-only bind mount, in a mount namespace of the command's own (unshare), so
    nothing of it outlives the test."""
    source, target = user_env / "src", user_env / "ro"
    source.mkdir()
    target.mkdir()
    if subprocess.run(["unshare", "--mount", "--map-root-user", "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine lets no process make a mount namespace (unshare), so no read-only mount")
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(target / "runs"), RLBOOST_CACHE=str(user_env / "cache"))
    script = (f"mount --bind -o ro {source} {target} && exec {sys.executable} -m rlboost.cli train "
              "--set run.steps=1")
    proc = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script], cwd=user_env, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Read-only file system" in lines[0] and "RLBOOST_RUN_ROOT" in lines[0], lines


def test_a_gpu_run_on_a_machine_without_gpus_or_its_engine_names_both_gpus_first(user_env, capsys, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    line = _one_line_exit_2(["train", "--recipe", "qwen3_gpu", "--set", "rollout.backend=sglang"], capsys)
    assert line.index("GPUs") < line.index("sglang") and "pip install 'rlboost[sglang]'" in line


def test_a_local_ray_cluster_that_does_not_start_is_one_line_and_leaves_no_run(user_env, monkeypatch, capsys):
    """Ray raises a bare Exception when its GCS or raylet misses the start deadline (seen on
    this 2-core machine at load 20); the user gets one line saying nothing started, not Ray's
    40-line traceback."""
    import rlboost.cluster.session as session

    def ray_init_that_times_out_for_tests(**_):
        raise Exception("The current node timed out during startup. This could happen because some of "
                        "the raylet failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(session.ray, "init", ray_init_that_times_out_for_tests)
    assert main(["train", "--set", "run.steps=1"]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1, lines
    assert "Ray's local cluster did not start" in lines[0] and "timed out during startup" in lines[0]
    assert "cluster.address" in lines[0] and "Traceback" not in lines[0]
    runs = user_env / "runs"
    assert not runs.exists() or not any(runs.iterdir())
