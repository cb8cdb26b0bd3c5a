"""What the driver does with a failure it can recover from, without starting anything: it
goes back to the last checkpoint as a resume does (metrics and events after it dropped,
the clock running on, the failed launch's instance time billed), records the restart,
and stops after run.max_restarts with one line saying how to continue; the summary counts
restarts and deaths, and its reserved-only estimate does not depend on which instance died."""

from __future__ import annotations

import json
import random

import pytest
import ray.exceptions

from rlboost.cluster.cost import CostLedger
from rlboost.errors import StepFailed
from rlboost.run.directory import RunDirectory
from rlboost.run.outcome import RecoverableFailure, RestartsExhausted, ending_lines, exit_code, halted, recoverable
from rlboost.run.report import reserved_only_estimate, summarize
from rlboost.run.supervisor import Supervisor


def _run(tmp_path, steps: int = 4, checkpoint: int | None = 2) -> RunDirectory:
    """Steps 1..steps done, one second apart on the run clock (step k ends at 10 k s), with
    a checkpoint of `checkpoint` taken at its end; the clock now at 10 * steps + 5 s."""
    run = RunDirectory(tmp_path / "run")
    run.record_launch("start", first_step=1)
    for step in range(1, steps + 1):
        run.append_event("join", t=10.0 * step - 5, instance=f"spot-{step}", pool="preemptible")
        run.append_metrics({"step": step, "samples": 8, "samples_trained": 8, "samples_unique": 8,
                            "elapsed_s": 10.0 * step, "step_wall_s": 1.0, "total_tokens": 10})
    if checkpoint is not None:
        folder = run.checkpoint_dir(checkpoint)
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"step": checkpoint, "elapsed_s": 10.0 * checkpoint,
                                                       "ledger": {"seconds": {"reserved": 1.0}, "tokens": 20}}))
    run.continue_clock(10.0 * steps + 5)
    return run


def _failure(run: RunDirectory, step: int, resume_from: int | None, what: str = "trainer rank 1") -> RecoverableFailure:
    return halted(RecoverableFailure, f"{what} died in step {step}", run, step, resume_from)


def _ledger(reserved_s: float) -> CostLedger:
    ledger = CostLedger()
    ledger.carry({"seconds": {"reserved": reserved_s, "preemptible": 2.0}, "tokens": 40})
    return ledger


def test_a_restart_goes_back_to_the_checkpoint_and_bills_the_time_lost(tmp_path):
    run = _run(tmp_path)
    restart = Supervisor(run, max_restarts=3, seed=0).restart(_failure(run, 5, 2), _ledger(45.0))
    assert restart.first == 3
    assert restart.line == "restart 1/3: trainer rank 1 died in step 5; continuing from the checkpoint of step 2"
    assert [m["step"] for m in run.metrics()] == [1, 2] and run.step == 3
    # the instance time up to the failure is billed; tokens count the steps kept only
    assert restart.ledger == {"seconds": {"reserved": 45.0, "preemptible": 2.0}, "tokens": 20}
    events = run.events()
    assert [e["instance"] for e in events if e["kind"] == "join"] == ["spot-1", "spot-2"]
    *_, record, launch = events
    assert record["kind"] == "restart" and launch == {**launch, "kind": "launch", "reason": "restart", "step": 3}
    assert record["cause"] == "trainer rank 1 died in step 5" and record["failed_step"] == 5
    assert record["checkpoint"] == 2 and record["lost_s"] == pytest.approx(25.0, abs=0.5)
    assert run.elapsed() >= 45.0  # the clock runs on: the redone steps come after the failure
    assert restart.at_s >= 45.0  # and the reserved cluster stays billed through the relaunch


def test_restarts_stop_at_max_restarts_and_say_how_to_continue(tmp_path):
    run = _run(tmp_path)
    supervisor = Supervisor(run, max_restarts=2, seed=0)
    supervisor.restart(_failure(run, 3, 2), _ledger(30.0))
    run.continue_clock(60.0)  # the second failure comes before another checkpoint
    second = supervisor.restart(_failure(run, 3, 2, "the controller"), _ledger(40.0))
    assert second.line.startswith("restart 2/2: the controller died in step 3;")
    # the first restart stays on record although the second went back past it
    assert [e["cause"] for e in run.events() if e["kind"] == "restart"] == [
        "trainer rank 1 died in step 3", "the controller died in step 3"]
    assert summarize(run).restarts == 2
    with pytest.raises(RestartsExhausted) as stop:
        supervisor.restart(_failure(run, 3, 2), _ledger(50.0))
    assert exit_code(stop.value) == 3
    assert ending_lines(stop.value) == [
        f"rlboost train: trainer rank 1 died in step 3 (after 2 restarts, run.max_restarts=2); continue from "
        f"the checkpoint of step 2 with: rlboost train --resume {run.path}"]


def test_without_restarts_the_first_failure_is_one_line(tmp_path):
    run = _run(tmp_path, checkpoint=None)
    with pytest.raises(RestartsExhausted) as stop:
        Supervisor(run, max_restarts=0, seed=0).restart(_failure(run, 2, None), _ledger(1.0))
    assert ending_lines(stop.value) == [
        "rlboost train: trainer rank 1 died in step 2 (no restart, run.max_restarts=0); no checkpoint was "
        f"written, so it cannot be resumed: {run.path} keeps the metrics, plots and summary of the steps it "
        "finished; start the run again with the same command"]
    assert [m["step"] for m in run.metrics()] == [1, 2, 3, 4]  # nothing was rewound


def test_without_a_checkpoint_the_run_starts_over_as_it_first_did(tmp_path):
    run = _run(tmp_path, checkpoint=None)
    random.seed(99)
    restart = Supervisor(run, max_restarts=1, seed=7).restart(_failure(run, 3, None), _ledger(5.0))
    assert restart.first == 1 and run.metrics() == [] and restart.ledger["tokens"] == 0
    assert restart.line.endswith("; continuing from step 1 (no checkpoint yet)")
    assert random.random() == random.Random(7).random()  # the run's seed, as at its start
    assert [e["kind"] for e in run.events()] == ["launch", "restart", "launch"]


def test_dead_processes_and_failed_steps_are_recoverable_other_failures_are_not():
    step_failed = StepFailed("samples [3, 4] were never finished")
    wrapped = ray.exceptions.RayTaskError("next_microbatch", "Traceback ...", step_failed)
    assert recoverable(wrapped, [], 4) == "step 4 failed: StepFailed: samples [3, 4] were never finished"
    assert recoverable(RuntimeError("gloo: connection closed"), ["trainer rank 1"], 2) == \
        "trainer rank 1 died in step 2"
    assert recoverable(RuntimeError("a bug"), [], 2) is None
    assert recoverable(ValueError("bad value"), [], 2) is None


def _metrics(reserved: list[int], spot: list[int]) -> list[dict]:
    return [{"step": s + 1, "total_tokens": r + p, "tokens_per_instance": {"reserved-0": r, "spot-0": p},
             "window_s": 0.2, "step_wall_s": 1.0, "phase_rollout_s": 0.4, "phase_wait_s": 0.1,
             "elapsed_s": 10.0 * (s + 1), "reserved_usd": 0.008 * (s + 1)}
            for s, (r, p) in enumerate(zip(reserved, spot))]


def _event(step: int, kind: str, instance: str, **more) -> dict:
    pool = "reserved" if instance.startswith("reserved") else "preemptible"
    return {"t": 10.0 * step - 5, "step": step, "kind": kind, "instance": instance, "pool": pool, **more}


def test_the_reserved_only_estimate_does_not_depend_on_which_instance_died():
    """While a reserved engine is dead (and until its replacement is active) the local
    window runs without it: those steps say nothing about the reserved cluster's rate."""
    spot_died = reserved_only_estimate(_metrics([30, 30, 30, 30], [20, 20, 20, 20]),
                                       [_event(2, "death", "spot-0", reason="lost")])
    reserved_died = reserved_only_estimate(
        _metrics([30, 5, 0, 30], [20, 45, 50, 20]),
        [_event(2, "death", "reserved-0", reason="lost"), _event(2, "join", "reserved-0"),
         _event(3, "active", "reserved-0")])
    assert spot_died > 0 and reserved_died == pytest.approx(spot_died)
    # never replaced: only the steps before its death measure the rate
    never = reserved_only_estimate(_metrics([30, 5, 0, 0], [20, 45, 50, 50]),
                                   [_event(2, "death", "reserved-0", reason="lost")])
    assert never == pytest.approx(spot_died)


def test_the_summary_counts_deaths_of_every_kind_and_the_restarts(tmp_path):
    run = RunDirectory(tmp_path / "run")
    for m in _metrics([30, 30, 30], [20, 20, 20]):
        run.append_metrics({**m, "samples": 8, "samples_trained": 8, "samples_unique": 8, "cost_usd": 0.01})
    for e in (_event(1, "notice", "spot-0"), _event(1, "gone", "spot-0", reason="reclaimed"),
              _event(2, "death", "spot-1", reason="killed", samples_resumed=3),
              _event(2, "death", "reserved-0", reason="lost", samples_resumed=5)):
        run.append_event(e.pop("kind"), **e)
    run.append_event("restart", t=31.0, step=3, cause="the controller died in step 3", lost_s=12.5)
    s = summarize(run)
    assert (s.notices, s.sudden, s.restarts) == (1, 2, 1)
    rows = dict(s.rows())
    assert rows["preemptions survived"] == "3 (1 with notice, 2 sudden)"
    assert rows["restarts from a checkpoint"] == \
        "1 (the controller died in step 3); 12.5 s of run time lost and redone, billed"
