"""What a checkpoint carries into a resumed run: the cost ledger's totals, the trace's
position, and files that are either complete or absent."""

from __future__ import annotations

import json
import random

from rlboost.cluster.cost import CostConfig, CostLedger
from rlboost.rundir import RunDirectory
from rlboost.runtime import STATE_FILE, checkpoint_state, save_checkpoint


class FakeClusterForTests:
    """What save_checkpoint needs of a Cluster: a ledger and a trainer that writes files."""

    def __init__(self, ledger: CostLedger, replay=None):
        self.ledger, self.replay = ledger, replay
        self.saved_into = []

    def save_checkpoint(self, directory, tokenizer_dir) -> None:
        self.saved_into.append(directory)
        (directory / "model").mkdir(parents=True, exist_ok=True)
        (directory / "model" / "model.safetensors").write_bytes(b"weights")
        (directory / "optimizer.pt").write_bytes(b"adam")


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
