"""An embedded engine on a GPU in a build without CUDA kernels (rlboost._C.HAS_CUDA False): it
says so when it starts and migrates its samples without KV pages, instead of failing at its
first KV export."""

import pytest
import torch
from engine_contract import Collected, collect, make_state, poll_until

from rlboost import _C
from rlboost.errors import RolloutError
from rlboost.rollout.embedded import engine as embedded
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig


def test_the_check_at_start_names_the_fix(monkeypatch):
    monkeypatch.setattr(_C, "HAS_CUDA", False)
    with pytest.warns(RuntimeWarning, match=r"HAS_CUDA is False.*RLBOOST_WITH_CUDA=ON pip install"):
        assert embedded._kv_kernels_for(torch.device("cuda", 0)) is False
    assert embedded._kv_kernels_for(torch.device("cpu")) is True  # CPU pages need no kernels
    monkeypatch.setattr(_C, "HAS_CUDA", True)
    assert embedded._kv_kernels_for(torch.device("cuda", 0)) is True


def test_without_kernels_samples_move_by_re_prefill(monkeypatch, tiny_ckpt):
    config = EmbeddedEngineConfig(model_dir=str(tiny_ckpt), stream_interval=1)
    with EmbeddedEngine(config) as source:
        source.submit([make_state(1, 0, max_new=30)])
        poll_until(source, {}, lambda o: 1 in o)
        batch = source.export_states(with_kv=True)
    assert batch.has_kv
    monkeypatch.setattr(embedded, "_kv_kernels_for", lambda device: False)  # as on a GPU without them
    with EmbeddedEngine(config) as engine:
        assert engine.exports_kv is False
        engine.submit([make_state(2, 0, max_new=300)])
        with pytest.raises(RolloutError, match="RLBOOST_WITH_CUDA=ON"):
            engine.export_states([2], with_kv=True)
        assert [s.sample_id for s in engine.export_states([2]).states] == [2]  # nothing was taken
        engine.import_states(batch)  # its pages are dropped: re-prefill
        state = batch.states[0]
        out = collect(engine, [1], {1: Collected(ids=list(state.output_ids))})
        assert out[1].finish == "length" and len(out[1].ids) == 30
