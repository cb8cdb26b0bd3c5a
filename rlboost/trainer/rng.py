"""Every trainer rank's random state (torch's CPU and CUDA generators, Python's `random`,
numpy's global generator) saved into a checkpoint as one file per rank, and handed back
to the same rank on resume, so a resumed run draws what the original run would have.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

RNG_FORMAT_VERSION = 1


def rng_file(rank: int) -> str:
    """The file of `rank`'s random state inside a checkpoint folder."""
    return f"rng_rank{rank}.pt"


def capture(device: torch.device) -> dict:
    """This process's random state, as plain tensors and tuples (loadable with
    torch.load(weights_only=True)).

    >>> sorted(capture(torch.device("cpu")))
    ['format_version', 'numpy', 'python', 'torch']
    """
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"format_version": RNG_FORMAT_VERSION, "torch": torch.get_rng_state(),
             "python": random.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def check(state: object) -> None:
    """ValueError unless `state` is what capture() returns (read back from a checkpoint),
    so a damaged file is refused before any rank starts."""
    if not isinstance(state, dict) or state.get("format_version") != RNG_FORMAT_VERSION:
        raise ValueError(f"expected a random state of format_version {RNG_FORMAT_VERSION}")
    numpy_state = state.get("numpy")
    if (not isinstance(state.get("torch"), torch.Tensor) or state["torch"].dtype != torch.uint8
            or not isinstance(numpy_state, tuple) or len(numpy_state) != 5
            or not isinstance(numpy_state[1], torch.Tensor)):
        raise ValueError("its torch or numpy state is not as rlboost writes it")
    try:
        random.Random().setstate(state.get("python"))
    except (TypeError, ValueError, OverflowError):
        raise ValueError("its Python random state is not one") from None


def restore(state: dict, device: torch.device) -> None:
    """Set this process's generators to a state capture() returned."""
    if state.get("format_version") != RNG_FORMAT_VERSION:
        raise ValueError(f"random state format_version must be {RNG_FORMAT_VERSION}, "
                         f"got {state.get('format_version')!r}")
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if device.type == "cuda":
        if "cuda" not in state:
            raise ValueError("the checkpoint holds no CUDA random state for a rank that runs on CUDA")
        torch.cuda.set_rng_state(state["cuda"], device)


def save_all(directory: Path, device: torch.device) -> None:
    """Collective: every rank's state is gathered to rank 0, which writes one file per rank
    (ranks on other machines need not see the folder)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    states = [None] * world if rank == 0 else None
    dist.gather_object(capture(device), states, dst=0)
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        for r, state in enumerate(states):
            torch.save(state, directory / rng_file(r))


def load_all(directory: Path, device: torch.device) -> bool:
    """Collective: rank 0 reads the files and each rank restores its own. Returns False on
    a rank whose file is missing (a checkpoint saved by fewer ranks): it keeps its state."""
    rank, world = dist.get_rank(), dist.get_world_size()
    states = None
    if rank == 0:
        paths = [directory / rng_file(r) for r in range(world)]
        states = [torch.load(p, weights_only=True) if p.is_file() else None for p in paths]
    mine = [None]
    dist.scatter_object_list(mine, states, src=0)
    if mine[0] is None:
        return False
    restore(mine[0], device)
    return True
