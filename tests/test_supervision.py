"""`rlboost train` survives the loss of its own processes. Each test starts the real command
on a short recipe, kills one of its processes mid-run by its process id (read from the
run's events.jsonl, checked to belong to the run) and checks that the run completes with
every step once in metrics.jsonl, each trained on all of its samples exactly once:

- the controller or a trainer rank: the driver restarts the run from its last checkpoint
  and says so (one line, an event, the summary);
- the reserved engine or a preemptible instance: no restart; a new reserved engine
  replaces the dead one, and the dead instance's samples resume elsewhere;
- with run.max_restarts=0, or a killed driver, the run stops and `--resume` completes it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from own_processes import descendants, finish, jsonl, kill_below, kill_leftovers, rlboost, started_at, wait_until

GROUPS, GROUP_SIZE, STEPS = 8, 4, 4
SHORT = [
    "--set", f"run.steps={STEPS}", "--set", "run.progress=false", "--set", "run.checkpoint_every=1",
    "--set", "model.warmup_steps=10", "--set", f"task.groups_per_step={GROUPS}",
    "--set", f"task.group_size={GROUP_SIZE}", "--set", "trainer.microbatch_groups=2", "--set", "rollout.capacity=8",
    "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1",
]
# Emulated engines that take about five seconds per step: a kill one second into a step
# meets samples in flight (the trainer, controller, weight pulls and migrations stay real).
SLOW_ROLLOUT = [
    "--set", "rollout.backend=emulated", "--set", "task.max_new_tokens=24",
    "--set", "rollout.emulated.decode_tokens_per_s=200", "--set", "rollout.emulated.sample_tokens_per_s=5",
    "--set", "rollout.emulated.stop_probability=0.01",
]
RUN_TIMEOUT_S = 420


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    for name in ("RLBOOST_RAY_ADDRESS", "RLBOOST_SET"):
        env.pop(name, None)
    return env


def _run_dir(tmp_path: Path, proc) -> Path:
    return wait_until(lambda: next((tmp_path / "runs").glob("*/events.jsonl"), None), 240, "run directory",
                      proc).parent


def _after_checkpoint(run: Path, step: int, proc) -> None:
    wait_until(lambda: (run / "checkpoints" / f"step_{step:06d}" / "COMPLETE").is_file(), RUN_TIMEOUT_S,
               f"checkpoint of step {step}", proc)


def _processes(run: Path) -> dict:
    """The run's controller and trainer ranks, as its current launch recorded them."""
    return [e for e in jsonl(run / "events.jsonl") if e["kind"] == "processes"][-1]


def _active_pid(run: Path, instance: str, proc) -> int:
    return wait_until(lambda: next((e["pid"] for e in jsonl(run / "events.jsonl")
                                    if e["kind"] == "active" and e["instance"] == instance), None),
                      RUN_TIMEOUT_S, f"active {instance}", proc)


def _completed(proc, run: Path) -> str:
    """The run ended well; returns what it printed on stderr."""
    code, out, err = finish(proc, RUN_TIMEOUT_S)
    assert code == 0, f"rlboost train exited {code}:\n{err[-4000:]}"
    assert Path(out.strip().splitlines()[-1]) == run
    _every_sample_once(run)
    assert not list(run.glob(".rendezvous-*"))
    return err


def _every_sample_once(run: Path) -> None:
    metrics = jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))  # each step exactly once
    for m in metrics:  # complete groups: every sample of the step trained on once
        assert m["samples"] == m["samples_trained"] == m["samples_unique"] == GROUPS * GROUP_SIZE
        assert m["duplicates"] == 0 and m["gaps"] == 0 and m["sample_versions"] == [m["step"]]
    assert "| samples lost | 0 |" in (run / "summary.md").read_text()


def _restarted(run: Path, err: str, who: str) -> None:
    """The driver restarted the run once, from the checkpoint before the failed step."""
    line = next(ln for ln in err.splitlines() if ln.startswith("restart "))
    found = re.fullmatch(rf"restart 1/3: {who} died in step (\d+); continuing from the checkpoint of step (\d+)",
                         line)
    assert found, line
    failed, checkpoint = int(found.group(1)), int(found.group(2))
    assert checkpoint == failed - 1 >= 1
    restart = next(e for e in jsonl(run / "events.jsonl") if e["kind"] == "restart")
    assert (restart["failed_step"], restart["checkpoint"]) == (failed, checkpoint)
    launches = [(e["reason"], e["step"]) for e in jsonl(run / "events.jsonl") if e["kind"] == "launch"]
    assert launches == [("start", 1), ("restart", failed)]
    assert f"| restarts from a checkpoint | 1 ({who} died in step {failed}); " in (run / "summary.md").read_text()
    # the reserved cluster is billed without a gap from the checkpoint through the relaunch
    before, after = (next(m for m in jsonl(run / "metrics.jsonl") if m["step"] == s) for s in (checkpoint, failed))
    cost = json.loads((run / "config.json").read_text())["cost"]
    usd_per_s = cost["reserved_usd_per_hour"] / 3600 * cost["time_scale"]
    held_s = after["elapsed_s"] - before["elapsed_s"]
    assert after["reserved_usd"] - before["reserved_usd"] == pytest.approx(held_s * usd_per_s, rel=1e-3)


def test_a_trainer_rank_that_dies_is_restarted_from_the_last_checkpoint(tmp_path):
    proc = rlboost(SHORT, tmp_path, _env(tmp_path))
    run = _run_dir(tmp_path, proc)
    _after_checkpoint(run, 1, proc)
    kill_below(proc.pid, [_processes(run)["trainer_ranks"][1]["pid"]])
    err = _completed(proc, run)
    _restarted(run, err, "trainer rank 1")


@pytest.mark.slow
def test_a_controller_that_dies_is_restarted_from_the_last_checkpoint(tmp_path):
    proc = rlboost(SHORT, tmp_path, _env(tmp_path))
    run = _run_dir(tmp_path, proc)
    _after_checkpoint(run, 1, proc)
    kill_below(proc.pid, [_processes(run)["controller"]["pid"]])
    err = _completed(proc, run)
    _restarted(run, err, "the controller")


def _instance_killed_mid_step(tmp_path: Path, instance: str) -> tuple[Path, str]:
    proc = rlboost([*SHORT, *SLOW_ROLLOUT], tmp_path, _env(tmp_path))
    run = _run_dir(tmp_path, proc)
    pid = _active_pid(run, instance, proc)
    _after_checkpoint(run, 1, proc)
    time.sleep(1.0)  # aims the kill one second into step 2 (no condition is awaited)
    kill_below(proc.pid, [pid])
    return run, _completed(proc, run)


@pytest.mark.slow
def test_a_reserved_engine_that_dies_is_replaced_and_the_step_goes_on(tmp_path):
    run, err = _instance_killed_mid_step(tmp_path, "reserved-0")
    assert "restart " not in err
    events = [e for e in jsonl(run / "events.jsonl") if e.get("instance") == "reserved-0"]
    kinds = [e["kind"] for e in events]
    assert kinds[:5] == ["join", "active", "death", "join", "active"], kinds
    death = events[2]
    assert death["reason"] == "lost" and death["step"] >= 2 and death["samples_resumed"] >= 0
    summary = (run / "summary.md").read_text()
    assert "| preemptions survived | 1 (0 with notice, 1 sudden) |" in summary
    assert "| restarts from a checkpoint | 0 |" in summary


@pytest.mark.slow
def test_a_preemptible_instance_that_dies_is_a_death_and_its_samples_resume(tmp_path):
    run, err = _instance_killed_mid_step(tmp_path, "spot-s0")
    assert "restart " not in err
    deaths = [e for e in jsonl(run / "events.jsonl") if e["kind"] == "death"]
    assert [(e["instance"], e["reason"]) for e in deaths] == [("spot-s0", "lost")]
    assert sum(m["deaths"] for m in jsonl(run / "metrics.jsonl")) == 1
    assert "| preemptions survived | 1 (0 with notice, 1 sudden) |" in (run / "summary.md").read_text()


@pytest.mark.slow
def test_without_restarts_a_death_stops_the_run_in_one_line_and_resume_completes_it(tmp_path):
    env = _env(tmp_path)
    proc = rlboost([*SHORT, "--set", "run.max_restarts=0"], tmp_path, env)
    run = _run_dir(tmp_path, proc)
    _after_checkpoint(run, 1, proc)
    kill_below(proc.pid, [_processes(run)["trainer_ranks"][1]["pid"]])
    code, _, err = finish(proc, RUN_TIMEOUT_S)
    lines = [ln for ln in err.splitlines() if ln.startswith("rlboost train")]
    assert code == 3 and len(lines) == 1, err[-3000:]
    assert re.fullmatch(rf"rlboost train: trainer rank 1 died in step (\d+) \(no restart, run.max_restarts=0\); "
                        rf"continue from the checkpoint of step \d+ with: rlboost train --resume {re.escape(str(run))}",
                        lines[0]), lines[0]
    resumed = rlboost(["--resume", str(run)], tmp_path, env)
    _completed(resumed, run)


@pytest.mark.slow
def test_a_killed_driver_leaves_no_rendezvous_behind_a_resume(tmp_path):
    env = _env(tmp_path)
    proc = rlboost(SHORT, tmp_path, env)
    run = _run_dir(tmp_path, proc)
    _after_checkpoint(run, 1, proc)
    below = {pid: started_at(pid) for pid in descendants(proc.pid)}  # its Ray processes
    kill_below(os.getpid(), [proc.pid])
    finish(proc, 60)
    kill_leftovers(below)  # Ray's agents outlive a killed driver for a minute or so
    assert list(run.glob(".rendezvous-*"))  # the file rendezvous of the killed launch
    resumed = rlboost(["--resume", str(run)], tmp_path, env)
    _completed(resumed, run)
