"""events.jsonl: every line carries the run clock's time and the step it happened in, and a
launch (start, resume, restart) is recorded so plots can mark it."""

from __future__ import annotations

import pytest

from rlboost.run.directory import RunDirectory


def test_every_event_carries_the_step_in_progress(tmp_path):
    run = RunDirectory.create(tmp_path, "r")
    run.append_event("join", instance="reserved-0")  # while the first step is being prepared
    for step in (1, 2):
        run.append_event("notice", instance=f"spot-{step}")  # during the step
        run.append_metrics({"step": step, "elapsed_s": run.elapsed()})
    run.append_event("gone", instance="spot-1", reason="shutdown")  # after the last step
    assert [(e["kind"], e["step"]) for e in run.events()] == [
        ("join", 1), ("notice", 1), ("notice", 2), ("gone", 3)]
    times = [e["t"] for e in run.events()]
    assert times == sorted(times)


def test_a_resumed_directory_counts_steps_from_its_checkpoint(tmp_path):
    run = RunDirectory(tmp_path / "r")
    for step in (1, 2, 3):
        run.append_metrics({"step": step})
    reopened = RunDirectory(run.path)
    assert reopened.step == 4
    reopened.truncate_metrics(2)  # resuming from the checkpoint of step 2
    assert reopened.step == 3
    reopened.record_launch("resume", first_step=3)
    launch = reopened.events()[-1]
    assert (launch["kind"], launch["reason"], launch["step"]) == ("launch", "resume", 3)


def test_record_launch_refuses_what_a_plot_could_not_read(tmp_path):
    run = RunDirectory(tmp_path / "r")
    with pytest.raises(ValueError, match="reason must be one of"):
        run.record_launch("rerun", first_step=1)
    with pytest.raises(ValueError, match="first_step"):
        run.record_launch("start", first_step=0)
    assert run.events() == []
