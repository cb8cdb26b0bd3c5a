"""A pull into memory the process may not write is refused with a ValueError naming `into`
(a native write there would fault and kill the process); writable mappings still work."""

from __future__ import annotations

import mmap
import warnings

import numpy as np
import pytest
import torch

from rlboost.transfer import WeightPuller
from rlboost.transfer.descriptors import require_writable

from .helpers import assert_same, random_tensors


def _quiet(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns on non-writable buffers
        return make()


def _readonly_memmap(path, nbytes: int) -> torch.Tensor:
    path.write_bytes(bytes(nbytes))
    return _quiet(lambda: torch.from_numpy(np.memmap(path, mode="r", dtype=np.uint8)))


def _readonly_anonymous(nbytes: int) -> torch.Tensor:
    m = mmap.mmap(-1, nbytes, prot=mmap.PROT_READ)
    return _quiet(lambda: torch.frombuffer(m, dtype=torch.uint8))


@pytest.mark.parametrize("make", ["memmap", "anonymous"])
def test_pull_into_read_only_memory_raises_value_error(publisher, config, tmp_path, make):
    tensors = random_tensors()
    manifest = publisher.publish(1, tensors)
    nbytes = manifest.total_bytes + 4096
    ro = _readonly_memmap(tmp_path / "ro.bin", nbytes) if make == "memmap" else _readonly_anonymous(nbytes)
    with WeightPuller(publisher.address, config) as puller:
        with pytest.raises(ValueError, match="into"):
            puller.pull(1, into=ro, timeout=30)
        assert bytes(ro[:64].numpy()) == bytes(64)
        assert_same(puller.pull(1, timeout=30), tensors)  # the puller is still usable


def test_pull_into_writable_file_mapping_works(publisher, config, tmp_path):
    tensors = random_tensors()
    manifest = publisher.publish(1, tensors)
    path = tmp_path / "rw.bin"
    path.write_bytes(bytes(manifest.total_bytes))
    rw = torch.from_numpy(np.memmap(path, mode="r+", dtype=np.uint8))
    with WeightPuller(publisher.address, config) as puller:
        assert_same(puller.pull(1, into=rw, timeout=30), tensors)


def test_require_writable_accepts_ordinary_and_empty_tensors_and_refuses_partly_read_only():
    require_writable(torch.zeros(1 << 20, dtype=torch.uint8), "x")
    require_writable(torch.zeros(0), "x")
    ro = _readonly_anonymous(2 * mmap.PAGESIZE)
    with pytest.raises(ValueError, match="^dest: "):
        require_writable(ro[mmap.PAGESIZE:], "dest")


def test_a_checked_tensor_is_not_rechecked_but_a_new_read_only_one_is(tmp_path):
    # foreign memory is checked once per tensor; when that tensor goes, a read-only mapping
    # that lands at the same address (mmap reuses freed ranges) is checked afresh
    for i in range(20):
        path = tmp_path / f"w{i}.bin"
        path.write_bytes(bytes(1 << 16))
        writable = torch.from_numpy(np.memmap(path, mode="r+", dtype=np.uint8))
        require_writable(writable, "into")
        require_writable(writable, "into")
        del writable
        with pytest.raises(ValueError, match="into"):
            require_writable(_readonly_memmap(tmp_path / f"r{i}.bin", 1 << 16), "into")
