"""The embedded torch engine passes the RolloutEngine contract on a tiny checkpoint."""

import pytest
from engine_contract import ContractTarget, EngineContract

from rlboost.models import ModelConfig, load_pretrained
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig


@pytest.fixture
def contract_target(tiny_ckpt, tiny_ckpt_other):
    config = EmbeddedEngineConfig(model_dir=str(tiny_ckpt), stream_interval=2, num_blocks=512,
                                  weight_version=3)
    return ContractTarget(
        make_engine=lambda: EmbeddedEngine(config),
        vocab_size=ModelConfig.load(tiny_ckpt).vocab_size,
        weight_version=3,
        weights=lambda: load_pretrained(tiny_ckpt).state_dict(),
        other_weights=lambda: load_pretrained(tiny_ckpt_other).named_weights(),
    )


class TestEmbeddedEngine(EngineContract):
    pass
