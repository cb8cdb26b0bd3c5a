"""A run directory keeps metrics, events and checkpoints, and its plots render."""

from __future__ import annotations

from rlboost.run.directory import RunDirectory
from rlboost.run.plots import plot_run


def test_metrics_events_and_plots(tmp_path):
    run = RunDirectory.create(tmp_path, "tiny")
    run.write_config({"recipe": "tiny"})
    for step in range(3):
        run.append_metrics({"step": step, "reward_mean": 0.1 * step, "tokens_per_s": 50.0 + step,
                            "phase_rollout_s": 1.0, "phase_train_s": 0.5})
    run.append_event("join", instance="p0", pool="preemptible", preemptible_up=1, reserved_up=0)
    run.append_event("notice", instance="p0", pool="preemptible", preemptible_up=1, reserved_up=0, grace_s=1.0)
    run.append_event("gone", instance="p0", pool="preemptible", preemptible_up=0, reserved_up=0,
                     reason="reclaimed")
    assert [m["step"] for m in run.metrics()] == [0, 1, 2]
    assert [e["kind"] for e in run.events()] == ["join", "notice", "gone"]
    written = plot_run(run)
    assert {p.name for p in written} == {"reward_throughput.png", "phases.png", "availability.png"}
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latest_checkpoint_needs_complete_marker_and_truncate(tmp_path):
    run = RunDirectory(tmp_path / "r")
    assert run.latest_checkpoint() is None
    for step in (2, 4):
        d = run.checkpoint_dir(step)
        d.mkdir()
        (d / "COMPLETE").write_text("")
    run.checkpoint_dir(6).mkdir()  # interrupted while writing: not complete
    assert run.latest_checkpoint() == (4, run.checkpoint_dir(4))
    for step in range(7):
        run.append_metrics({"step": step})
    run.truncate_metrics(4)
    assert [m["step"] for m in run.metrics()] == [0, 1, 2, 3, 4]


def test_a_bounded_staleness_run_gets_a_staleness_plot(tmp_path):
    run = RunDirectory.create(tmp_path, "tiny")
    for step in range(3):
        run.append_metrics({"step": step, "reward_mean": 0.1, "tokens_per_s": 50.0, "phase_train_s": 0.5,
                            "staleness_tokens": [100 - 10 * step, 10 * step], "is_weight_mean": 1.01,
                            "is_truncated_share": 0.002})
    written = {p.name: p for p in plot_run(run)}
    assert written["staleness.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
