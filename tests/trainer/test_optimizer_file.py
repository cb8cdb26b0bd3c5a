"""optimizer.pt is read with weights_only=True: what save_checkpoint writes loads, and a
file that would run code on load is refused with a CheckpointError (and runs nothing)."""

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from rlboost.errors import CheckpointError
from rlboost.trainer.rank import read_optimizer_file

RAN = []


def _payload_ran() -> None:
    RAN.append(True)


class _RunsCodeOnLoad:
    def __reduce__(self):
        return (_payload_ran, ())


def test_the_optimizer_state_rlboost_writes_loads_weights_only(tmp_path):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    torch.save({"optimizer": state, "torch_rng": torch.get_rng_state()}, tmp_path / "optimizer.pt")
    saved = read_optimizer_file(str(tmp_path / "optimizer.pt"))
    assert saved["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    exp_avg = saved["optimizer"]["state"]["weight"]["exp_avg"]
    assert torch.equal(exp_avg, state["state"]["weight"]["exp_avg"])


def test_a_file_that_would_run_code_is_refused_without_running_it(tmp_path):
    torch.save({"optimizer": _RunsCodeOnLoad()}, tmp_path / "optimizer.pt")
    with pytest.raises(CheckpointError, match="weights_only"):
        read_optimizer_file(str(tmp_path / "optimizer.pt"))
    assert RAN == []


def test_a_file_of_another_shape_is_refused(tmp_path):
    torch.save([1, 2], tmp_path / "optimizer.pt")
    with pytest.raises(CheckpointError, match="expected a dict"):
        read_optimizer_file(str(tmp_path / "optimizer.pt"))
