"""`rlboost train` end to end, as a user runs it: a shortened tiny_cpu recipe with one
preemption of each kind, then a resume for one more step, and Ctrl-C.

Each test starts the real command in a subprocess (its own Ray cluster, trainer ranks,
controller and rollout instance actors) with its run root and model cache in tmp_path.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SHORT = [
    "--set", "run.steps=3", "--set", "run.progress=false", "--set", "run.checkpoint_every=10",
    "--set", "model.warmup_steps=10", "--set", "task.groups_per_step=8", "--set", "task.group_size=4",
    "--set", "trainer.microbatch_groups=2", "--set", "rollout.capacity=8",
    "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=2",
    "--set", "cluster.initial_preemptible=2", "--set", "cluster.inject=notice@2,kill@3",
    "--set", "cluster.notice_s=3",
]
SAMPLES_PER_STEP = 8 * 4
# What the Ctrl-C tests run: a long run with one preemptible instance and no preemption (the
# stop, not the preemptions, is what they look at; each instance is a process to start).
LONG = [a.replace("run.steps=3", "run.steps=200").replace("run.progress=false", "run.progress=true")
        .replace("preemptible=2", "preemptible=1").replace("notice@2,kill@3", "") for a in SHORT]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    return env


def _train(tmp_path: Path, *args: str, timeout: float = 600) -> Path:
    # cwd=tmp_path: the installed package is imported, not the source tree
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *args], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert len(proc.stdout.strip().splitlines()) == 1, proc.stdout  # stdout: the run directory alone
    return Path(proc.stdout.strip())


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> tuple[Path, Path]:
    """One shortened run with both preemptions, read by the tests below (each run spends
    most of its time starting Ray and its processes): its folder and run directory."""
    base = tmp_path_factory.mktemp("preempted")
    return base, _train(base, *SHORT)


def _first_steps(run: Path, steps: int = 3) -> list[dict]:
    return [m for m in _jsonl(run / "metrics.jsonl") if m["step"] <= steps]  # before any resume


@pytest.mark.timeout(900)  # its module's whole runs; on a loaded 2-core machine one has taken minutes
def test_short_run_survives_both_preemptions_and_resumes(preempted):
    tmp_path, run = preempted
    metrics = _first_steps(run)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        # every sample of the step trained on exactly once, none lost or duplicated
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == SAMPLES_PER_STEP
        assert m["duplicates"] == 0 and m["gaps"] == 0
        # strictly on-policy: step k trains on samples of weight version k only
        assert m["weight_version"] == m["step"] and m["sample_versions"] == [m["step"]]
        assert math.isfinite(m["reward_mean"]) and 0.0 <= m["reward_mean"] <= 1.0
        assert m["tokens_per_s"] > 0 and m["publish_bytes"] > 0
    events = _jsonl(run / "events.jsonl")
    kinds = [(e["kind"], e.get("instance")) for e in events]
    assert ("notice", "spot-s0") in kinds and ("gone", "spot-s0") in kinds
    assert ("death", "spot-s1") in kinds
    assert all("t" in e and 1 <= e["step"] <= 4 for e in events)
    assert all(e["preemptible_up"] <= 2 for e in events if "instance" in e)  # cluster.max_preemptible
    ckpt = run / "checkpoints" / "step_000003"
    assert (ckpt / "COMPLETE").is_file() and (ckpt / "optimizer.pt").is_file()
    assert (ckpt / "model" / "config.json").is_file() and (ckpt / "model" / "model.safetensors").is_file()
    assert json.loads((ckpt / "state.json").read_text())["weight_version"] == 4
    summary = (run / "summary.md").read_text()
    assert "| samples lost | 0 |" in summary and "1 with notice, 1 sudden" in summary
    assert {p.name for p in (run / "plots").iterdir()} >= {"reward_throughput.png", "availability.png",
                                                           "phases.png"}

    resumed = _train(tmp_path, "--resume", str(run), "--set", "run.steps=4")
    assert resumed == run
    metrics = _jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[-1]["weight_version"] == 4 and metrics[-1]["sample_versions"] == [4]
    assert metrics[-1]["samples_unique"] == SAMPLES_PER_STEP
    # costs continue from the checkpoint: the resumed step adds to what steps 1-3 cost
    assert metrics[-1]["cost_usd"] > metrics[2]["cost_usd"]
    assert metrics[-1]["tokens_billed"] == sum(m["total_tokens"] for m in metrics)
    assert (run / "checkpoints" / "step_000004" / "COMPLETE").is_file()
    assert not list(run.glob(".rendezvous-*"))  # each launch removes its rendezvous file


def _wait_for(stream, text: str, timeout: float) -> str:
    """Read a child's output until text appears (select waits for output, up to timeout)."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([stream], [], [], max(0.0, left))
        chunk = os.read(stream.fileno(), 4096).decode(errors="replace") if ready else ""
        if not chunk:
            raise AssertionError(f"{text!r} did not appear within {timeout} s; output:\n{seen[-3000:]}")
        seen += chunk
    return seen


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> tuple[int, list[str], Path]:
    """A long run with one preemptible instance and no preemption, stopped by one Ctrl-C once
    its progress bar shows step 3 done: its exit code, stderr lines and run directory (the
    stop is read by the test below, its first steps by the preemption test above)."""
    tmp_path = tmp_path_factory.mktemp("stopped")
    proc = subprocess.Popen([sys.executable, "-m", "rlboost.cli", "train", *LONG], cwd=tmp_path,
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(proc.stderr, "| 3/200", timeout=600)  # the progress bar shows step 3 done
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.decode(errors="replace").strip().splitlines()
    assert lines and "rlboost train --resume " in lines[-1], "\n".join(lines[-30:])
    return proc.returncode, lines, Path(lines[-1].split("rlboost train --resume ", 1)[1])


@pytest.mark.timeout(900)  # its module's whole runs; on a loaded 2-core machine one has taken minutes
def test_ctrl_c_checkpoints_the_current_step_and_stops(stopped):
    code, lines, run = stopped
    assert code == 130, "\n".join(lines[-30:])  # interrupted, though cleanly
    # the last line says where it stopped and the command that continues it
    assert lines[-1].startswith("rlboost train: stopped at step "), lines[-3:]
    assert f"stopped at step {_jsonl(run / 'metrics.jsonl')[-1]['step']} " in lines[-1]
    last = _jsonl(run / "metrics.jsonl")[-1]["step"]
    assert 3 <= last < 200
    assert (run / "checkpoints" / f"step_{last:06d}" / "COMPLETE").is_file()
    assert (run / "summary.md").is_file()


@pytest.mark.timeout(900)  # its module's whole runs; on a loaded 2-core machine one has taken minutes
def test_preemptions_change_nothing_the_trainer_sees(preempted, stopped):
    """Sampling depends only on (seed, sample, position) and resumed samples continue from
    their last token, so a run with both preemptions trains on exactly what a run without
    them (the Ctrl-C run: one preemptible instance, never preempted) does: the same rewards
    step by step."""
    disturbed = _first_steps(preempted[1])
    undisturbed = _first_steps(stopped[2])
    assert len(undisturbed) == len(disturbed) == 3
    assert [m["reward_mean"] for m in disturbed] == [m["reward_mean"] for m in undisturbed]
    assert [m["total_tokens"] for m in disturbed] == [m["total_tokens"] for m in undisturbed]


def test_bad_settings_fail_before_anything_starts(tmp_path, capsys):
    from rlboost.cli import main

    assert main(["train", "--set", "run.steps=many"]) == 2
    assert "run.steps" in capsys.readouterr().err
    assert main(["train", "--recipe", "nope"]) == 2
    assert "tiny_cpu" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_joining_a_cluster_from_the_environment_with_a_loopback_config_is_refused(monkeypatch, tmp_path, capsys):
    from rlboost.cli import main

    monkeypatch.setenv("RLBOOST_RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path))
    assert main(["train"]) == 2  # tiny_cpu binds loopback: useless across machines
    assert "transfer.bind_host" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no run directory was made


@pytest.mark.timeout(900)  # its module's whole runs; on a loaded 2-core machine one has taken minutes
def test_two_ctrl_c_a_moment_apart_stop_at_once(tmp_path):
    """The second press lands while the driver waits in ray.get, where Python runs its
    handler once a second: it must still count, stop the run within seconds and say how to
    resume (exit 130), and the run's processes must not outlive it."""
    from own_processes import descendants, kill_leftovers, started_at

    one_rank = ["--set", "trainer.world_size=1"]  # the stop is the driver's: one rank will do
    proc = subprocess.Popen([sys.executable, "-m", "rlboost.cli", "train", *LONG, *one_rank], cwd=tmp_path,
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    processes: dict[int, int | None] = {}
    try:
        _wait_for(proc.stderr, "| 1/200", timeout=600)
        processes = {pid: started_at(pid) for pid in descendants(proc.pid)}
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        stopped_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.decode(errors="replace").strip().splitlines()
    assert proc.returncode == 130, "\n".join(lines[-30:])
    assert any(line.startswith("rlboost train: interrupted in step ") for line in lines[-2:]), lines[-3:]
    assert "rlboost train --resume " in lines[-1] or "start the run again" in lines[-1], lines[-3:]
    print(f"stopped {stopped_s:.1f} s after the second Ctrl-C")  # the figure; no timing assertion
    deadline = time.monotonic() + 60  # Ray's reaper ends the local cluster once the driver is gone
    while any(started_at(p) == s for p, s in processes.items()) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [p for p, s in processes.items() if s is not None and started_at(p) == s]
    kill_leftovers(processes)
    assert left == [], f"processes of the run outlived it: {left}"
    # what the stop left: whole files only; a folder without a checkpoint says so and holds none
    for run in (tmp_path / "runs").glob("*"):
        assert not [p for p in run.rglob("*.tmp") if p.is_file()], list(run.rglob("*.tmp"))
        if not list(run.glob("checkpoints/step_*")):
            assert not (run / "checkpoints").exists() and "keeps the metrics" in lines[-1]
