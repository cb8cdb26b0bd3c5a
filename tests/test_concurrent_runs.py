"""Runs started at once never share a run directory, and a checkpoint cache entry that
one run completed is never deleted by another that built the same entry."""

from __future__ import annotations

import threading

from rlboost.run.directory import RunDirectory
from rlboost.trainer import starting_weights as checkpoints


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path):
    made, barrier = [], threading.Barrier(6)

    def start():
        barrier.wait()
        made.append(RunDirectory.create(tmp_path / "runs", "tiny").path)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == len(set(made)) == 6
    assert all(p.is_dir() and p.name.startswith("tiny-") for p in made)


def test_a_complete_cache_entry_is_kept_when_a_concurrent_build_finishes_second(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBOOST_CACHE", str(tmp_path / "cache"))
    key = {"model": "tiny", "seed": 1}

    def first_build(out):
        (out / "model.safetensors").write_bytes(b"first")

    def second_build(out):
        # while this build runs, another run completes the same entry and starts reading it
        winner = checkpoints._cached("tiny", key, first_build)
        held = (winner / "model.safetensors").open("rb")
        second_build.reader = (winner, held)
        (out / "model.safetensors").write_bytes(b"second")

    final = checkpoints._cached("tiny", key, second_build)
    winner, held = second_build.reader
    assert final == winner and (final / "COMPLETE").is_file()
    assert (final / "model.safetensors").read_bytes() == b"first"  # never replaced under its reader
    held.close()
    leftovers = [p.name for p in final.parent.iterdir() if p != final]
    assert leftovers == []  # the losing build was discarded


def test_an_incomplete_leftover_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBOOST_CACHE", str(tmp_path / "cache"))
    key = {"model": "tiny", "seed": 2}
    probe = checkpoints._cached("tiny", key, lambda out: None)
    (probe / "COMPLETE").unlink()  # as an interrupted build of an older layout would leave it
    (probe / "junk").write_text("x")
    final = checkpoints._cached("tiny", key, lambda out: (out / "model.safetensors").write_bytes(b"ok"))
    assert final == probe and (final / "COMPLETE").is_file() and not (final / "junk").exists()
    assert [p.name for p in final.parent.iterdir()] == [final.name]
