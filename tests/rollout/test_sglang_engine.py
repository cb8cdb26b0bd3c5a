"""The SGLang adapter passes the RolloutEngine contract against FakeSGLangEngineForTests."""

import pytest

from engine_contract import ContractTarget, EngineContract
from fake_sglang import FakeSGLangEngineForTests
from rlboost.models import ModelConfig, load_pretrained
from rlboost.rollout.sglang_engine import SGLangEngine, SGLangEngineConfig

VERSION = 3


@pytest.fixture
def contract_target(tiny_ckpt, tiny_ckpt_other):
    config = SGLangEngineConfig(model_path=str(tiny_ckpt), stream_interval=2, weight_version=VERSION)
    return ContractTarget(
        make_engine=lambda: SGLangEngine(config, engine_factory=FakeSGLangEngineForTests),
        vocab_size=ModelConfig.load(tiny_ckpt).vocab_size,
        weight_version=VERSION,
        weights=lambda: load_pretrained(tiny_ckpt).state_dict(),
        other_weights=lambda: load_pretrained(tiny_ckpt_other).named_weights(),
        supports_kv=False,
    )


class TestSGLangEngine(EngineContract):
    pass
