"""What a new user meets first, typed as the README has it: `rlboost report` of a
simulation, what `rlboost train` leaves on stdout, `simulate --steps`, a stop before the
first checkpoint, the own-task warm-up, what the paper recipe says it is, a GPU recipe on a
machine without GPUs, and the command line's rough edges (--version, python -m rlboost,
--help, --set across sections, --calibrate); --debug and a finished run resumed: test_cli_errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.cli import RECIPES, SCENARIOS, main
from rlboost.run.directory import RunDirectory

ROOT = Path(__file__).resolve().parent.parent


def _metrics(step: int) -> dict:
    return {"step": step, "reward_mean": 0.25 * step, "tokens_per_s": 100.0, "samples": 8, "samples_trained": 8,
            "samples_unique": 8, "total_tokens": 80, "rollout_time_s": 0.8, "step_wall_s": 1.0, "elapsed_s": 5.0 * step,
            "tokens_per_instance": {"reserved-0": 80}, "window_s": 0.5, "phase_rollout_s": 0.5, "phase_train_s": 0.3,
            "cost_usd": 0.01 * step, "reserved_usd": 0.01 * step, "prompts_dropped": 0,
            "records_refused": {"too deep": 2, "not UTF-8": 1}, "reward_failures_by_kind": {"AnswerTooLong": 3}}


def _run(path: Path, config: dict | None = None) -> RunDirectory:
    run = RunDirectory(path)
    for step in (1, 2):
        run.append_metrics(_metrics(step))
    run.append_event("launch", reason="start")
    if config is not None:
        run.write_config(config)
    return run


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    """A short `rlboost simulate` run (2 steps of the paper scenario, its sweep shortened too)."""
    root = tmp_path_factory.mktemp("sim")
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(root / "runs"))
    proc = subprocess.run([sys.executable, "-m", "rlboost", "simulate", "--steps", "2", "--quiet"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip())


def test_report_of_a_simulation_leaves_its_summary_and_plots_as_they_are(simulated, capsys):
    before = {p.relative_to(simulated): p.read_bytes() for p in simulated.rglob("*") if p.is_file()}
    assert not (simulated / "checkpoints").exists()  # a simulation holds no checkpoint
    assert main(["report", str(simulated)]) == 0
    after = {p.relative_to(simulated): p.read_bytes() for p in simulated.rglob("*") if p.is_file()}
    assert after == before  # summary.md untouched, no reward plot drawn
    out = capsys.readouterr().out
    assert "Simulation: paper" in out and "nan" not in out


def test_simulate_refuses_too_few_steps_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path / "runs"))
    for steps in ("0", "1", "-3"):
        assert main(["simulate", "--steps", steps, "--quiet"]) == 2
        assert "--steps must be at least 2" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_summary_table_goes_to_stderr_whole_and_stdout_keeps_the_run_directory(tmp_path, capsys):
    from rlboost.run.report import write_report

    run = _run(tmp_path / ("a-long-folder-name-" * 4) / "tiny_cpu-embedded-20261207-101010")
    write_report(run)
    out, err = capsys.readouterr()
    assert out == ""
    assert str(run.path) in err.replace("\n", "")  # and in one piece on one line
    assert any(str(run.path) in line for line in err.splitlines())


def test_a_run_stopped_before_its_first_checkpoint_says_what_its_folder_keeps(tmp_path):
    from rlboost.errors import RunInterrupted
    from rlboost.run.outcome import ending_lines, halted

    run = _run(tmp_path / "run")
    run.drop_unfinished_checkpoints()
    lines = ending_lines(halted(RunInterrupted, "interrupted", run, 3, None))
    assert lines[0] == "rlboost train: interrupted in step 3"
    assert str(run.path) in lines[1] and "keeps the metrics" in lines[1] and "cannot be resumed" in lines[1]
    assert not (run.path / "checkpoints").exists()


def test_a_new_run_stopped_at_once_before_any_step_leaves_no_folder(tmp_path):
    import rlboost.run.job as job

    fresh = RunDirectory(tmp_path / "fresh")  # the second Ctrl-C landed in step 1
    lines = job._interrupted_lines(fresh, new=True)
    assert "no step finished" in lines[-1] and not fresh.path.exists()
    kept = _run(tmp_path / "kept")
    lines = job._interrupted_lines(kept, new=True)
    assert "keeps the metrics" in lines[-1] and not (kept.path / "checkpoints").exists()


def test_a_plot_interrupted_while_it_is_written_leaves_no_half_file(tmp_path, monkeypatch):
    import matplotlib.figure

    from rlboost.run.plots import plot_run

    run = _run(tmp_path / "run")
    plot_run(run)
    before = (run.plots_dir / "reward_throughput.png").read_bytes()

    def pressed(self, *args, **kwargs):  # Ctrl-C in the middle of the write
        args[0].write(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", pressed)
    with pytest.raises(KeyboardInterrupt):
        plot_run(run)
    assert [p.name for p in run.plots_dir.iterdir() if p.name.endswith(".tmp")] == []
    assert (run.plots_dir / "reward_throughput.png").read_bytes() == before


def test_the_own_task_warm_up_trains_on_the_data_set_s_answers(tmp_path, monkeypatch):
    from rlboost.tasks.column_dataset import ColumnDatasetConfig
    from rlboost.tasks.config import TaskConfig
    from rlboost.trainer.starting_weights import ModelSource, prepare_checkpoint
    from rlboost.trainer.warmup import warmup_key, warmup_pairs

    monkeypatch.setenv("RLBOOST_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a}+{b}=", "sum": str(a + b)}) + "\n" for a in range(5) for b in range(5)))
    task = TaskConfig(name="dataset", dataset=ColumnDatasetConfig(path=str(data), prompt_key="q", answer_key="sum"))
    pairs = warmup_pairs(task)(4, seed=0)
    assert all(p.endswith("=") and a == str(eval(p[:-1])) for p, a in pairs)  # the data set's own problems
    assert (prepare_checkpoint(ModelSource(warmup_steps=2, warmup_batch=4), task) / "config.json").is_file()
    key = warmup_key(task)
    data.write_text(json.dumps({"q": "9+9=", "sum": "18"}) + "\n")
    assert warmup_key(task) != key  # a changed file warms up again
    sums = TaskConfig()  # generated sums, as tiny_cpu warms up
    assert warmup_pairs(sums)(2, seed=1) == warmup_pairs(sums)(2, seed=1)
    assert (prepare_checkpoint(ModelSource(warmup_steps=1, warmup_batch=2), sums) / "config.json").is_file()


def test_the_paper_recipe_says_it_is_emulated_and_what_it_emulates(capsys):
    assert main(["plan", "--recipe", "paper_qwen3_8b"]) == 0
    head = capsys.readouterr().out.splitlines()[:2]
    assert "emulated run (time_scale 25" in head[0] and "qwen3-8b" in head[0]
    assert head[1].startswith("qwen3-8b (8.19B parameters), 8 ranks on h100-sxm")


def test_an_emulated_run_s_summary_says_what_ran_and_the_modelled_rate(tmp_path):
    from rlboost.run.report import summarize

    config = {"rollout": {"backend": "emulated", "emulated": {"model": "qwen3-8b", "accelerator": "h100-sxm",
                                                              "time_scale": 25.0, "token_block": 64}},
              "trainer": {"device": "cpu"}}
    rows = dict(summarize(_run(tmp_path / "run"), config).rows())
    assert "emulated" in rows["what ran"] and "time_scale 25" in rows["what ran"] and "qwen3-8b" in rows["what ran"]
    assert "256 tokens/s of the modelled cluster" in rows["rollout tokens/s"]  # 100 x 64 / 25
    assert rows["data set records refused at load"] == "3 (2 too deep, 1 not UTF-8)"
    assert "on the run's clock" in rows["preemptible pool empty"]


def test_a_gpu_recipe_on_a_machine_without_gpus_names_the_gpus_it_needs(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path))
    assert main(["train", "--recipe", "qwen3_gpu"]) == 2
    err = capsys.readouterr().err
    assert "needs 16 GPUs" in err and "this machine has 0" in err and len(err.strip().splitlines()) == 1


def test_version_and_python_dash_m():
    from rlboost import __version__

    for argv in (["rlboost", "--version"], [sys.executable, "-m", "rlboost", "--version"]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0 and proc.stdout.strip() == f"rlboost {__version__}", proc.stderr


def test_help_names_every_recipe_and_scenario(capsys):
    from rlboost.recipes import recipes
    from rlboost.recipes.scenarios import SCENARIOS as KNOWN

    assert set(RECIPES) == set(recipes()) and set(SCENARIOS) == set(KNOWN)
    for command, names in (("train", RECIPES), ("plan", RECIPES), ("simulate", SCENARIOS)):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(name in text for name in names), (command, text)


def test_a_check_across_sections_names_the_set_that_broke_it(capsys):
    assert main(["config", "--set", "trainer.device=cuda", "--set", "trainer.rank_gpus=1"]) == 2
    err = capsys.readouterr().err
    assert "--set trainer.device: rollout.embedded.device must be a CUDA device" in err and "--set :" not in err


def test_calibrate_reports_the_gap_to_verl_and_applies_nothing(monkeypatch):
    """`rlboost simulate --calibrate` checks the timing model against verl's reserved-only
    figure: it prints the prediction and its gap, and a factor that would close it as a
    what-if only (the model keeps its measured inputs)."""
    import rlboost.run.simulate as simulate
    from rlboost.timing import INPUTS

    before = repr(INPUTS)
    said = []
    # the simulations themselves: 40 steps a try
    monkeypatch.setattr(simulate, "baseline_tokens_per_s", lambda spec, groups: 1.25 * simulate.VERL_BASELINE_TOKENS_PER_S)
    monkeypatch.setattr(simulate, "scale_to_meet", lambda spec, groups: 0.71)
    monkeypatch.setattr(simulate, "task_groups", lambda config: None)
    assert simulate.calibrate_paper(echo=said.append, steps=3) == 0.71
    assert "+25.0%" in said[0] and "verl measured" in said[0]
    assert "not applied" in said[1] and "0.71" in said[1]
    assert repr(INPUTS) == before