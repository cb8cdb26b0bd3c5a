"""A resumed run continues every trainer rank's random streams: each of 2 gloo ranks gets
back the torch, Python and numpy generator state it had when the checkpoint was saved
(its own, not rank 0's), restored from the rng_rank{r}.pt files of the checkpoint."""

import random

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from rlboost.models import build_tiny_checkpoint
from rlboost.trainer.rank import MODEL_DIR, OPTIMIZER_FILE, RankSpec, TrainerRank
from rlboost.trainer.rng import rng_file
from rlboost.transfer import TransferConfig

WORLD = 2


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _draw() -> dict:
    return {"torch": torch.rand(4), "python": [random.random() for _ in range(3)],
            "numpy": np.random.rand(3).tolist()}


def _rank(rank: int, checkpoint: str) -> TrainerRank:
    return TrainerRank(RankSpec(rank=rank, world_size=WORLD, checkpoint=checkpoint, transfer=TransferConfig()))


def _original_run(rank: int, rendezvous: str, checkpoint: str, saved_into: str, out: str) -> None:
    trainer = _rank(rank, checkpoint)
    trainer.setup(rendezvous)
    try:
        _seed(100 + rank)  # the ranks' streams differ
        _draw()  # the run so far
        trainer.save_checkpoint(saved_into)
        torch.save(_draw(), f"{out}/after_save_{rank}.pt")  # what the run drew next
    finally:
        trainer.close()


def _resumed_run(rank: int, rendezvous: str, saved_into: str, out: str) -> None:
    _seed(7)  # a fresh launch: every rank starts from the same state
    trainer = _rank(rank, f"{saved_into}/{MODEL_DIR}")
    trainer.setup(rendezvous, optimizer_state=f"{saved_into}/{OPTIMIZER_FILE}")
    try:
        torch.save(_draw(), f"{out}/after_resume_{rank}.pt")
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rng")
    checkpoint = str(build_tiny_checkpoint(root / "tiny", arch="qwen3", seed=1, vocab_size=263,
                                           hidden_size=16, intermediate_size=32, num_layers=1))
    saved_into = root / ".step_000001.tmp"  # the staging folder a run renames when complete
    mp.spawn(_original_run, args=(f"file://{root / 'rdzv1'}", checkpoint, str(saved_into), str(root)),
             nprocs=WORLD, join=True)
    mp.spawn(_resumed_run, args=(f"file://{root / 'rdzv2'}", str(saved_into), str(root)),
             nprocs=WORLD, join=True)
    return {"saved_into": saved_into,
            "after_save": [torch.load(root / f"after_save_{r}.pt") for r in range(WORLD)],
            "after_resume": [torch.load(root / f"after_resume_{r}.pt") for r in range(WORLD)]}


def test_each_rank_resumes_the_random_streams_it_saved(runs):
    for rank in range(WORLD):
        saved, resumed = runs["after_save"][rank], runs["after_resume"][rank]
        assert torch.equal(resumed["torch"], saved["torch"]), rank
        assert resumed["python"] == saved["python"] and resumed["numpy"] == saved["numpy"], rank
    first, second = runs["after_save"]
    assert not torch.equal(first["torch"], second["torch"])  # each rank its own state
    assert first["python"] != second["python"] and first["numpy"] != second["numpy"]


def test_the_checkpoint_holds_one_random_state_file_per_rank(runs):
    for rank in range(WORLD):
        state = torch.load(runs["saved_into"] / rng_file(rank), weights_only=True)
        assert state["format_version"] == 1 and "cuda" not in state  # a CPU rank
