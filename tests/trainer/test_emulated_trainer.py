"""The emulated trainer: micro-batches cost the timing model's training time (scaled by the
run's time_scale), the published payload is sized so a pull at the egress cap takes the
modelled weight transfer, one time_scale rules every duration, and it checkpoints."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlboost.cluster.cost import CostConfig
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.timing import LINK_BYTES_PER_S, model_shape
from rlboost.trainer.emulated import EmulatedTrainer, EmulatedTrainerSpec, TrainerTiming
from rlboost.transfer.config import ServerConfig, TransferConfig

EMU = EmulatedEngineConfig(model="qwen3-8b", gpus=2, token_block=64, time_scale=25.0)


def test_time_scale_and_token_block_scale_the_training_time():
    base = TrainerTiming(dataclasses.replace(EMU, time_scale=1.0, token_block=1), gpus=8)
    scaled = TrainerTiming(EMU, gpus=8)
    assert scaled.microbatch_s([10, 20]) == pytest.approx(base.microbatch_s([640, 1280]) / 25.0)


def test_the_payload_takes_the_modelled_pull_time_at_the_egress_cap():
    t = TrainerTiming(EMU, gpus=8)
    egress = 2_000_000_000
    seconds = model_shape("qwen3-8b").weight_bytes / LINK_BYTES_PER_S / 25.0
    assert t.payload_bytes(egress) / egress == pytest.approx(seconds, rel=1e-3)
    with pytest.raises(ValueError, match="egress_bytes_per_s"):
        t.payload_bytes(None)


def test_one_time_scale_for_the_engines_and_the_bill():
    TrainerTiming.check_scale(EMU, CostConfig(time_scale=25.0))
    with pytest.raises(ValueError, match="cost.time_scale"):
        TrainerTiming.check_scale(EMU, CostConfig(time_scale=1.0))


def test_it_publishes_steps_and_checkpoints(tmp_path):
    model = tmp_path / "start"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = EmulatedTrainerSpec(emulated=dataclasses.replace(EMU, time_scale=1e6), gpus=8, checkpoint=str(model),
                               transfer=TransferConfig(publisher=ServerConfig(egress_bytes_per_s=10**9)))
    trainer = EmulatedTrainer(spec)
    try:
        assert trainer.setup() == int(model_shape("qwen3-8b").params)  # 8.19e9, from its config
        out = trainer.publish(1)
        assert out["bytes"] >= trainer.payload > 0
        ids = torch.ones(2, 5, dtype=torch.long)
        batch = type("B", (), {"attention_mask": ids, "response_mask": ids.bool()})()
        trainer.accumulate(batch)
        step = trainer.finish_step(10.0)
        assert step["microbatches"] == 1 and step["tokens"] == 10 and step["train_s"] > 0
        trainer.save_checkpoint(str(tmp_path / "ckpt"))
        assert (tmp_path / "ckpt" / "model" / "config.json").is_file()
        assert (tmp_path / "ckpt" / "optimizer.pt").is_file()
    finally:
        trainer.close()
