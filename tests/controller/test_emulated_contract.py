"""The emulated engine passes the same RolloutEngine contract as the embedded engine."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))  # the shared contract suite

from engine_contract import ContractTarget, EngineContract  # noqa: E402

from rlboost.rollout.emulated.engine import EmulatedEngine, EmulatedEngineConfig  # noqa: E402

VERSION = 3


def weights():
    return {"model.embed_tokens.weight": torch.arange(32.0).reshape(8, 4), "lm_head.weight": torch.ones(8, 4)}


def other_weights():
    return {name: t + 0.5 for name, t in weights().items()}


def make_engine():
    engine = EmulatedEngine(EmulatedEngineConfig(vocab_size=320, sample_tokens_per_s=400.0,
                                                 decode_tokens_per_s=4000.0, max_running=16,
                                                 stop_probability=0.05))
    engine.load_weights(weights(), VERSION)
    return engine


@pytest.fixture
def contract_target():
    return ContractTarget(make_engine=make_engine, vocab_size=320, weight_version=VERSION,
                          weights=weights, other_weights=other_weights, supports_kv=True)


class TestEmulatedEngine(EngineContract):
    pass


def test_kv_pages_in_a_foreign_layout_or_not_matching_the_tokens_are_refused():
    from rlboost.errors import RolloutError
    from rlboost.migration.batch import MigrationBatch
    from rlboost.migration.layout import KVLayout

    src, dst = make_engine(), make_engine()
    from engine_contract import make_state
    src.submit([make_state(1, VERSION, max_new=300)])
    batch = src.export_states(with_kv=True)
    bad = MigrationBatch(states=batch.states, kv_layout=batch.kv_layout, kv_tokens=batch.kv_tokens,
                         kv_data=(torch.zeros_like(batch.kv_data[0]),))
    with pytest.raises(RolloutError, match="do not match"):
        dst.import_states(bad)
    other = KVLayout(num_layers=1, num_kv_heads=1, head_dim=2, block_size=16, dtype="float16")
    foreign = MigrationBatch(states=batch.states, kv_layout=other, kv_tokens=batch.kv_tokens,
                             kv_data=batch.kv_data)
    with pytest.raises(RolloutError, match="layout"):
        dst.import_states(foreign)
    dst.import_states(batch)
    assert dst.load().running + dst.load().queued == 1
