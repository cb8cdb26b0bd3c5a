"""What a checkpoint carries into a resumed run: the cost ledger's totals, the trace's
position, and files that are either complete or absent."""

from __future__ import annotations

import json
import random

import torch

from rlboost.cluster.cost import CostConfig, CostLedger
from rlboost.config.run import RunConfig
from rlboost.models.checkpoint import build_tiny_checkpoint
from rlboost.run.checkpoints import checkpoint_state, open_run, save_checkpoint
from rlboost.run.directory import RunDirectory
from rlboost.trainer.checkpoint import STATE_FILE, choose_resume_point


class FakeClusterForTests:
    """What save_checkpoint needs of a Cluster: a ledger and a trainer that writes files."""

    def __init__(self, ledger: CostLedger, trace: dict | None = None):
        self.ledger, self.trace = ledger, trace
        self.saved_into = []

    def trace_position(self) -> dict | None:
        return self.trace

    def save_checkpoint(self, directory, tokenizer_dir) -> None:
        self.saved_into.append(directory)
        build_tiny_checkpoint(directory / "model", seed=len(self.saved_into), hidden_size=16,
                              intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
        torch.save({"optimizer": {"label": "adam"}}, directory / "optimizer.pt")


def test_costs_continue_across_a_resume(tmp_path):
    prices = CostConfig(reserved_usd_per_hour=3600.0, preemptible_usd_per_hour=360.0)  # $1/s, $0.1/s
    run = RunDirectory(tmp_path / "run")
    ledger = CostLedger(prices)
    ledger.start("reserved-cluster", "reserved", at_s=0.0)
    ledger.start("spot-0", "preemptible", at_s=0.0)
    ledger.add_tokens(500)
    run._t0 -= 10.0  # ten seconds into the run
    save_checkpoint(FakeClusterForTests(ledger), run, 3, tmp_path)
    before = ledger.summary(at_s=run.elapsed())

    state = checkpoint_state(RunDirectory(run.path), 4)
    resumed = CostLedger(prices)
    resumed.carry(state["ledger"])
    carried = resumed.summary(at_s=0.0)
    assert carried.tokens == 500
    assert abs(carried.total_usd - before.total_usd) < 0.5  # what the first launch spent, not 0
    resumed.start("reserved-cluster", "reserved", at_s=20.0)
    resumed.add_tokens(100)
    later = resumed.summary(at_s=25.0)
    assert later.tokens == 600 and later.reserved_usd > carried.reserved_usd + 4.9


def test_checkpoint_state_restores_the_driver_random_state(tmp_path):
    run = RunDirectory(tmp_path / "run")
    random.seed(7)
    save_checkpoint(FakeClusterForTests(CostLedger()), run, 1, tmp_path)
    expected = random.random()
    random.seed(99)
    state = checkpoint_state(run, 2)
    assert random.random() == expected and state["step"] == 1
    assert json.loads((run.checkpoint_dir(1) / STATE_FILE).read_text())["weight_version"] == 2
    assert checkpoint_state(run, 1) == {}


def test_resume_keeps_the_trace_position_and_drops_what_came_after_the_checkpoint(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.append_event("join", instance="spot-0", up=1)
    for step in (1, 2):
        run.append_metrics({"step": step, "elapsed_s": run.elapsed()})
    run._t0 -= 10.0
    save_checkpoint(FakeClusterForTests(CostLedger(), {"duration_s": 30.0, "offset_s": 7.5}), run, 2, tmp_path)
    run._t0 -= 10.0  # a step that never reached a checkpoint, and its preemption
    run.append_metrics({"step": 3, "elapsed_s": run.elapsed()})
    run.append_event("death", instance="spot-0", up=0)

    resumed, first = open_run(RunConfig(), str(run.path), echo=print)
    assert first == 3
    assert [m["step"] for m in resumed.metrics()] == [1, 2]
    assert [e["kind"] for e in resumed.events()] == ["join", "launch"]  # the resume is recorded
    assert resumed.events()[-1]["reason"] == "resume" and resumed.events()[-1]["step"] == 3
    assert checkpoint_state(resumed, first)["trace"] == {"duration_s": 30.0, "offset_s": 7.5}
    assert 10.0 <= resumed.elapsed() < 20.0  # the clock goes on from the checkpoint


class CrashingClusterForTests(FakeClusterForTests):
    """A trainer that dies half way through writing its files."""

    def save_checkpoint(self, directory, tokenizer_dir) -> None:
        (directory / "optimizer.pt").write_bytes(b"half")
        raise RuntimeError("rank 0 died")


def test_a_save_that_dies_half_way_leaves_no_checkpoint_to_resume_from(tmp_path):
    run = RunDirectory(tmp_path / "run")
    save_checkpoint(FakeClusterForTests(CostLedger()), run, 1, tmp_path)
    try:
        save_checkpoint(CrashingClusterForTests(CostLedger()), run, 2, tmp_path)
    except RuntimeError:
        pass
    assert not run.checkpoint_dir(2).exists()
    point = choose_resume_point(run.path / "checkpoints")
    assert point.step == 1 and point.skipped == ()

    save_checkpoint(FakeClusterForTests(CostLedger()), run, 2, tmp_path)  # the step saved again
    assert choose_resume_point(run.path / "checkpoints").step == 2
    assert sorted(p.name for p in (run.path / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert torch.load(run.checkpoint_dir(2) / "optimizer.pt", weights_only=True) == {"optimizer": {"label": "adam"}}


def test_run_seed_seeds_the_driver(tmp_path, monkeypatch):
    from rlboost.config.overrides import apply_overrides

    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path / "runs"))
    draws = []
    for seed in (5, 5, 6):
        open_run(apply_overrides(RunConfig(), [f"run.seed={seed}"]), None, echo=print)
        draws.append((random.random(), float(torch.rand(1))))
    assert draws[0] == draws[1] and draws[0] != draws[2]


def test_a_run_stopped_at_once_names_its_resume_command_even_while_its_checkpoint_is_written(tmp_path, monkeypatch):
    """The last words of a run whose processes do not close in time are read beside the main
    thread, which may be renaming or replacing a checkpoint that moment: whatever reading the
    checkpoints raises, the user still gets the step and the command that continues the run."""
    import rlboost.run.job as job

    run = RunDirectory(tmp_path / "run")
    run.append_metrics({"step": 1})
    assert job._interrupted_lines(run) == [
        "rlboost train: interrupted in step 2",
        f"no checkpoint was written, so it cannot be resumed: {run.path} keeps the metrics, plots and summary of "
        "the steps it finished; start the run again with the same command"]

    def being_replaced(_run):
        raise FileNotFoundError("step_000002/model.safetensors")

    monkeypatch.setattr(job, "last_checkpoint_step", being_replaced)
    first, last = job._interrupted_lines(run)
    assert first == "rlboost train: interrupted in step 2"
    assert last.endswith(f"rlboost train --resume {run.path}")


def test_a_stop_now_press_outside_a_step_still_ends_with_the_step_and_the_resume_command(tmp_path, monkeypatch):
    """The second Ctrl-C can land after the last step, while the run's processes close or its
    report is written: the run still ends as interrupted in a step, with the command that
    continues it, not as a bare 'interrupted'."""
    import pytest

    import rlboost.run.job as job
    from rlboost.errors import RunInterrupted
    from rlboost.recipes import get_recipe

    def steps_then_a_press_while_closing_for_tests(config, run, launch, terminal, stop):
        run.append_metrics({"step": 1})
        raise KeyboardInterrupt

    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setattr(job, "prepare_launch", lambda *a, **k: None)
    monkeypatch.setattr(job, "supervise", steps_then_a_press_while_closing_for_tests)
    monkeypatch.setattr(job, "write_report", lambda *a, **k: None)
    try:
        job.train(get_recipe("tiny_cpu"), echo=lambda line: None)
    except RunInterrupted as exc:
        assert exc.step == 2 and exc.resume_from is None
        assert str(tmp_path / "runs") in exc.run_dir
    except KeyboardInterrupt:
        pytest.fail("the press left train() as a bare KeyboardInterrupt")
    else:
        pytest.fail("train() returned although the run was stopped")
