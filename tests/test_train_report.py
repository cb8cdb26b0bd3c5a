"""`rlboost report RUN_DIR`: the summary and plots come from the run directory alone."""

from __future__ import annotations

from rlboost.cli import main
from rlboost.run.directory import RunDirectory
from rlboost.run.report import summarize


def _run(tmp_path, *, trained_last: int = 16, spot_tokens: int = 20, window_s: float = 0.2) -> RunDirectory:
    run = RunDirectory(tmp_path / "run")
    for step, trained in ((1, 16), (2, 16), (3, trained_last)):
        run.append_metrics({"step": step, "reward_mean": 0.2 * step, "tokens_per_s": 100.0, "samples": 16,
                            "samples_trained": trained, "samples_unique": min(trained, 16),
                            "total_tokens": 30 + spot_tokens, "rollout_time_s": 0.5, "step_wall_s": 1.0,
                            "tokens_per_instance": {"reserved-0": 30, "spot-0": spot_tokens},
                            "window_s": window_s, "phase_rollout_s": 0.4, "phase_wait_s": 0.1,
                            "migrations": step - 1, "resumes": 3 if step == 2 else 0, "elapsed_s": 10.0 * step,
                            "cost_usd": 0.01 * step, "reserved_usd": 0.008 * step, "phase_train_s": 0.4})
    for kind, up in (("join", 1), ("active", 1), ("notice", 1), ("gone", 0), ("join", 1), ("death", 0)):
        run.append_event(kind, instance="spot-0", up=up)
    return run


def test_summary_counts_rewards_tokens_cost_and_preemptions(tmp_path):
    s = summarize(_run(tmp_path))
    assert (s.first_step, s.last_step, s.first_reward, s.last_reward) == (1, 3, 0.2, 0.6000000000000001)
    assert s.tokens == 150 and s.tokens_per_s == 100.0
    # reserved engines: 90 tokens in 0.6 s of window, so 150 tokens alone take 1.0 s where
    # rollout and waits took 1.5 s; $0.024 of reserved time over 30 s, 0.5 s less of it
    assert s.tokens_per_usd == 150 / 0.03
    assert abs(s.reserved_only_usd - (0.024 - 0.024 / 30 * 0.5)) < 1e-12
    assert (s.notices, s.sudden, s.migrations, s.resumes) == (1, 1, 3, 3)
    assert s.samples_lost == 0 and s.samples_duplicated == 0


def test_idle_preemptible_instances_show_no_gain(tmp_path):
    """Instances that were up but generated nothing only cost money: the reserved-only
    estimate is what the reserved instances cost, below the run's cost."""
    s = summarize(_run(tmp_path, spot_tokens=0, window_s=0.5))
    assert abs(s.reserved_only_usd - 0.024) < 1e-12
    assert s.tokens_per_usd < s.reserved_only_tokens_per_usd
    assert "-" in dict(s.rows())["tokens per dollar, reserved only (estimate: the same tokens at the "
                                 "reserved engines' measured rate)"]


def test_lost_and_duplicated_samples_show(tmp_path):
    assert summarize(_run(tmp_path, trained_last=12)).samples_lost == 4
    dup = summarize(_run(tmp_path / "d", trained_last=18))
    assert dup.samples_duplicated == 2 and dup.samples_lost == 0


def test_report_command_redraws_plots_and_writes_the_summary(tmp_path, capsys):
    run = _run(tmp_path)
    assert main(["report", str(run.path)]) == 0
    assert "| samples lost | 0 |" in (run.path / "summary.md").read_text()
    assert {p.name for p in run.plots_dir.iterdir()} == {"reward_throughput.png", "phases.png",
                                                         "availability.png"}
    assert "preemptions survived" in capsys.readouterr().out


def test_report_of_a_directory_without_metrics_fails_cleanly(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert not (tmp_path / "nothing").exists()
    assert "not a run directory" in capsys.readouterr().err


def test_the_summary_says_why_deltas_were_declined(tmp_path):
    run = RunDirectory(tmp_path / "deltas")
    for step, changed in ((1, 0.98), (2, 1.0), (3, 0.99)):
        run.append_metrics({"step": step, "reward_mean": 0.5, "publish_delta": {
            "base": step, "target": step + 1, "declined": True, "bytes": 1, "target_bytes": 4096,
            "values_changed": changed}})
    row = dict(summarize(run).rows())["weight deltas"]
    assert row.startswith("none served, 3 declined; declined: 99.0% of the values changed"), row
    assert "transfer.delta_max_fraction" in row


def test_the_share_of_changed_values_is_sampled_from_each_version():
    import torch

    from rlboost.transfer.delta import changed_share, sample_values
    from rlboost.transfer.manifest import Manifest

    a = {"w": torch.arange(100_000, dtype=torch.float32), "b": torch.ones(1000, dtype=torch.bfloat16)}
    manifest = Manifest.build(1, a)
    flat = torch.zeros(manifest.total_bytes, dtype=torch.uint8)
    views = {s.name: flat[s.offset:s.offset + s.nbytes].view(getattr(torch, s.dtype)) for s in manifest.tensors}
    for name, t in a.items():
        views[name].copy_(t)
    before = sample_values(flat, manifest)
    views["w"][::4] += 1.0  # a quarter of w's values, none of b's
    share = changed_share(before, sample_values(flat, manifest))
    assert abs(share - 0.25 * 400_000 / 402_000) < 0.01
