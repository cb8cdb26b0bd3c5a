"""Every bench/ script is exercised in the default suite, so that none breaks silently: the
light ones run end to end at a tiny size and end with their JSON line; the ones that need a
GPU, a downloaded model or a multi-node Ray cluster (minutes each) are imported whole and
have the configs they would run built and checked. A new script is covered once a file of
tests/bench names it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
REQUIRED_KEYS = {"metric", "value", "unit", "ceiling", "peers"}

RUNS = {  # script -> the smallest arguments that still run its whole path
    "offload_policy.py": ["--phases", "1,0", "--steps-per-phase", "2", "--settle", "1", "--groups", "4",
                          "--max-new", "64", "--mean-len", "20"],
    "migration_cost.py": ["--quick", "--no-big"],
    "embedded_decode.py": ["--tokens", "8"],
    "logprob_memory.py": ["--batch", "1", "--length", "64", "--vocab", "512", "--check-batch", "1"],
    "trainer_memory.py": ["--scale", "256", "--samples", "4"],
    "transfer_long_polls.py": ["--size", "4M", "--pollers", "2", "--repeats", "1"],
    "multi_turn.py": ["--steps", "2", "--groups", "4", "--group-size", "2", "--turn-tokens", "32", "--spot", "2",
                      "--preemptions", "2", "--preempt-every-s", "5"],
}
IMPORTED = ("cost_efficiency.py", "delta_weights.py", "live_capacity.py", "gpu_transfer.py")
# script -> (its JSON line's metric, peers it must report), where a reader relies on them
EXPECTED = {
    "migration_cost.py": ("kv_resume_speedup_tiny_256", {"reprefill_ms_256", "kv_ms_256", "scratch_ms_256"}),
    "multi_turn.py": ("multi_turn_tokens_per_usd", {"preemptions", "lost_s_per_preemption", "tool_reruns"}),
}


def _same_schedule_met_whole(peers):
    """Both preemptible runs met the whole schedule (a notice, then a sudden death) in their
    counted steps, and resuming from the last token ran no tool call twice."""
    assert set(map(tuple, peers["preemptions"].values())) == {(1, 1)}, peers["preemptions"]
    assert peers["tool_reruns"]["rlboost (resume from last token)"] == 0, peers["tool_reruns"]


CHECKS = {"multi_turn.py": _same_schedule_met_whole}  # script -> what its peers must show


def test_every_bench_script_is_named_by_a_smoke_test():
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    named = " ".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    assert scripts and not {s for s in scripts if s not in named}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_a_light_script_runs_and_ends_with_its_json_line(script, tmp_path):
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(BENCH / script), *RUNS[script]], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert REQUIRED_KEYS <= set(result), result
    if script in EXPECTED:
        metric, peers = EXPECTED[script]
        assert result["metric"] == metric and result["value"] > 0 and result["ceiling"] > 0, result
        assert peers <= set(result["peers"]), result["peers"]
    if script in CHECKS:
        CHECKS[script](result["peers"])


def _module(script: str, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", IMPORTED)
def test_a_heavy_script_imports_whole(script, monkeypatch):
    module = _module(script, monkeypatch)
    assert callable(module.main)


def test_cost_efficiency_builds_the_runs_it_would_train(monkeypatch):
    from rlboost.config.overrides import apply_overrides
    from rlboost.recipes import get_recipe

    module = _module("cost_efficiency.py", monkeypatch)
    monkeypatch.setattr(sys, "argv", ["cost_efficiency.py"])
    args = module.parse()
    config = apply_overrides(get_recipe(args.recipe), module.emulated_overrides(args))  # every field still exists
    assert config.rollout.backend == "emulated" and config.task.groups_per_step == args.groups
