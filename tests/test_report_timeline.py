"""What the availability plot draws, read from a run directory: instance counts on the
step axis, preemptions by kind, resumes; for new run directories and for ones written
before events carried steps, pools, reasons or launch records."""

from __future__ import annotations

import json

from rlboost.cli import main
from rlboost.run.directory import RunDirectory
from rlboost.run.plots import plot_run
from rlboost.run.timeline import StepClock, read_timeline

PNG = b"\x89PNG\r\n\x1a\n"


def _metrics(steps, start_s=10.0, step_s=2.0, gap_s=0.5):
    """Step k runs from start_s + (k-1)*(step_s+gap_s) for step_s seconds."""
    out = []
    for k in steps:
        begin = start_s + (k - 1) * (step_s + gap_s)
        out.append({"step": k, "elapsed_s": begin + step_s, "step_wall_s": step_s, "reward_mean": 0.1 * k,
                    "tokens_per_s": 100.0, "phase_rollout_s": 1.0, "phase_wait_s": 0.5, "phase_train_s": 0.5})
    return out


def _write(run, metrics, events):
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run.path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def _ev(t, kind, instance, pool="preemptible", **more):
    return {"t": t, "kind": kind, "instance": instance, "pool": pool, **more}


def test_times_map_into_their_step_on_the_step_axis():
    clock = StepClock.from_metrics(_metrics([1, 2, 3]))
    assert clock.step_at(11.0) == 0.5  # half way through step 1 (10 s to 12 s)
    assert clock.step_at(12.2) == 1.0  # between steps 1 and 2: on their boundary
    assert 1.0 < clock.step_at(13.0) < 2.0
    assert clock.step_at(0.0) == 0.0 and clock.step_at(99.0) == 3.0
    assert abs(clock.minutes_at(3.0) - 17.0 / 60) < 1e-9


def test_counts_are_whole_capped_and_the_shutdown_is_no_drop(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.write_config({"cluster": {"max_preemptible": 2}})
    events = [_ev(9.0, "join", "reserved-0", "reserved"),
              _ev(10.5, "join", "spot-0"), _ev(10.6, "join", "spot-1"),
              _ev(11.0, "active", "spot-0"), _ev(11.2, "active", "spot-1"),
              _ev(13.0, "notice", "spot-0", grace_s=1.0), _ev(14.0, "gone", "spot-0", reason="reclaimed"),
              _ev(14.1, "join", "spot-2"), _ev(15.5, "death", "spot-1"),
              _ev(20.0, "gone", "reserved-0", "reserved", reason="shutdown"),
              _ev(20.0, "gone", "spot-2", reason="shutdown")]
    _write(run, _metrics([1, 2, 3]), events)
    tl = read_timeline(run.metrics(), run.events())
    assert tl.axis == "step" and len(tl.segments) == 1
    seg = tl.segments[0]
    assert all(isinstance(c, int) for c in seg.placed + seg.serving)
    assert max(seg.placed) == 2 and all(s <= p for s, p in zip(seg.serving, seg.placed))
    assert seg.placed[-1] == 1 and seg.end_x == 3.0  # the run ended with one instance up
    notice, sudden = [m for m in tl.marks if m.kind == "notice"], [m for m in tl.marks if m.kind == "sudden"]
    assert len(notice) == 1 and len(sudden) == 1
    assert 1.0 < notice[0].x < notice[0].until_x < 2.0  # noticed and reclaimed during step 2
    assert {p.name for p in plot_run(run)} == {"availability.png", "phases.png", "reward_throughput.png"}


def test_a_noticed_instance_that_never_served_is_not_counted_serving():
    events = [_ev(10.5, "join", "spot-0"), _ev(11.0, "notice", "spot-0", grace_s=1.0),
              _ev(11.1, "active", "spot-0"), _ev(12.0, "gone", "spot-0", reason="reclaimed")]
    seg = read_timeline(_metrics([1, 2]), events).segments[0]
    assert max(seg.placed) == 1 and max(seg.serving) == 0


def test_a_launch_record_starts_counting_again_and_is_marked(tmp_path):
    events = [{"t": 1.0, "kind": "launch", "reason": "start", "step": 1},
              _ev(10.5, "join", "spot-0"), _ev(10.6, "join", "spot-1"), _ev(11.0, "active", "spot-0"),
              _ev(13.0, "notice", "spot-1", grace_s=5.0),  # the launch ends before its deadline
              {"t": 14.7, "kind": "launch", "reason": "restart", "step": 3},
              _ev(15.5, "join", "spot-0"), _ev(16.0, "active", "spot-0")]
    tl = read_timeline(_metrics([1, 2, 3]), events)
    notice, restart = tl.marks
    assert restart.kind == "restart" and not restart.inferred
    assert tl.segments[0].end_x == restart.x == notice.until_x == 2.0  # between steps 2 and 3
    # the second launch counts only its own instances, from zero
    assert len(tl.segments) == 2 and tl.segments[1].placed == [0, 1, 1] and tl.segments[1].serving == [0, 0, 1]


def test_report_draws_an_old_resumed_run_directory(tmp_path, capsys):
    """Written before this format: events without step, pool or reason, counts in `up`,
    no launch records; resumed from step 2's checkpoint (the later lines dropped)."""
    run = RunDirectory(tmp_path / "old")
    metrics = [dict(m, samples=8, samples_trained=8, samples_unique=8, total_tokens=40, rollout_time_s=1.0)
               for m in _metrics([1, 2, 3, 4])]
    old = [{"t": 9.0, "kind": "join", "instance": "reserved-0", "up": 0},
           {"t": 10.5, "kind": "join", "instance": "spot-0", "up": 1},
           {"t": 11.0, "kind": "notice", "instance": "spot-0", "grace_s": 1.0, "up": 1},
           {"t": 11.5, "kind": "active", "instance": "spot-0", "up": 1},  # logged late
           {"t": 12.0, "kind": "gone", "instance": "spot-0", "up": 0},
           {"t": 12.1, "kind": "join", "instance": "spot-1", "up": 1},
           {"t": 14.7, "kind": "join", "instance": "reserved-0", "up": 0},  # the resumed launch
           {"t": 14.8, "kind": "join", "instance": "spot-1", "up": 1},
           {"t": 20.0, "kind": "gone", "instance": "reserved-0", "up": 1},
           {"t": 20.0, "kind": "gone", "instance": "spot-1", "up": 0}]
    _write(run, metrics, old)
    tl = read_timeline(run.metrics(), run.events())
    assert [(m.kind, m.inferred) for m in tl.marks] == [("notice", False), ("resume", True)]
    assert len(tl.segments) == 2 and tl.segments[-1].placed[-1] == 1  # no drop at the end
    assert tl.segments[0].serving == [0] * len(tl.segments[0].serving)
    assert main(["report", str(run.path)]) == 0
    for name in ("availability.png", "phases.png", "reward_throughput.png"):
        assert (run.plots_dir / name).read_bytes()[:8] == PNG
    assert "1 with notice, 0 sudden" in capsys.readouterr().out


def test_without_step_times_the_plot_falls_back_to_minutes(tmp_path):
    run = RunDirectory(tmp_path / "run")
    _write(run, [{"step": 1, "reward_mean": 0.5}], [_ev(30.0, "join", "spot-0"), _ev(90.0, "death", "spot-0")])
    tl = read_timeline(run.metrics(), run.events())
    assert tl.axis == "minutes" and [m.x for m in tl.marks] == [1.5]
    assert "availability.png" in {p.name for p in plot_run(run)}
