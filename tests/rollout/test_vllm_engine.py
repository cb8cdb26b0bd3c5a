"""The vLLM adapter: the RolloutEngine contract, what it asks of vLLM and how it reads the
answers, checked against FakeAsyncLLMForTests under each release line's rules (vLLM itself
cannot run here; test_vllm_conformance.py checks against the package)."""

from __future__ import annotations

import os

import pytest
from engine_contract import Collected, ContractTarget, EngineContract, collect, make_state, poll_until, run_alone
from fake_vllm import FAKES, UNSET

from rlboost.errors import EngineStartFailed, RolloutError, WeightLoadFailed
from rlboost.models import ModelConfig, build_tiny_checkpoint, load_pretrained
from rlboost.rollout.vllm.engine import VLLMApi, VLLMEngine, VLLMEngineConfig
from rlboost.rollout.vllm.weights import shared_dir

VERSION = 3


@pytest.fixture(params=sorted(FAKES))
def release(request) -> str:
    """The vLLM release line whose rules the fake follows."""
    return request.param


def api_of(release: str, **knobs) -> VLLMApi:
    fake = FAKES[release]
    engine = type("KnobbedFake", (fake.AsyncLLM,), knobs) if knobs else fake.AsyncLLM
    return VLLMApi(AsyncLLM=engine, AsyncEngineArgs=fake.AsyncEngineArgs, SamplingParams=fake.SamplingParams,
                   RequestOutputKind=fake.RequestOutputKind)


@pytest.fixture
def contract_target(tiny_ckpt, tiny_ckpt_other, release):
    config = VLLMEngineConfig(model_path=str(tiny_ckpt), stream_interval=2, weight_version=VERSION)
    return ContractTarget(
        make_engine=lambda: VLLMEngine(config, api=api_of(release)),
        vocab_size=ModelConfig.load(tiny_ckpt).vocab_size,
        weight_version=VERSION,
        weights=lambda: load_pretrained(tiny_ckpt).state_dict(),
        other_weights=lambda: load_pretrained(tiny_ckpt_other).named_weights(),
        supports_kv=False,
    )


class TestVLLMEngine(EngineContract):
    pass


@pytest.fixture
def start(tiny_ckpt, release):
    engines = []

    def start(config_overrides=None, **knobs):
        config = VLLMEngineConfig(model_path=str(tiny_ckpt), stream_interval=2, weight_version=VERSION,
                                  **(config_overrides or {}))
        engines.append(VLLMEngine(config, api=api_of(release, **knobs)))
        return engines[-1]

    yield start
    for engine in engines:
        engine.close()


def test_requests_continue_a_sample_from_its_last_token(start):
    engine = start()
    engine.submit([make_state(1, VERSION, max_new=20, output=(4, 5, 6), logprobs=(-1.0,) * 3, seed=11)])
    collect(engine, [1], {1: Collected(ids=[4, 5, 6], logprobs=[-1.0] * 3)})
    (request,) = engine._engine.requests
    assert request["prompt_token_ids"][-3:] == [4, 5, 6]
    params = request["params"]
    assert params.max_tokens == 17 and params.ignore_eos and params.logprobs == 0
    assert params.seed is not None and params.output_kind.name == "DELTA"
    assert engine._engine.args.logprobs_mode == "processed_logprobs"
    assert engine._engine.args.worker_extension_cls == "rlboost.rollout.vllm.worker.RlboostWorkerExtension"


def test_weights_go_to_every_worker_through_shared_memory_and_the_cache_is_reset_once_idle(
        start, tiny_ckpt_other):
    engine = start({"tp_size": 2}, slow_abort_steps=200)
    engine.submit([make_state(1, VERSION, max_new=400)])
    poll_until(engine, {}, lambda o: True)
    engine.abort([1])  # vLLM's engine core holds its KV blocks for a while yet
    before = set(os.listdir(shared_dir()))
    engine.load_weights(load_pretrained(tiny_ckpt_other).named_weights(), VERSION + 1)
    events = engine._engine.events
    assert ("collective_rpc", "rlboost_load_weights") in events
    resets = [ok for kind, *rest in events if kind == "reset_prefix_cache" for ok in rest]
    assert resets[-1] is True and False in resets  # refused while the aborted request held blocks
    assert not {n for n in set(os.listdir(shared_dir())) - before if n.startswith("rlboost-vllm-")}
    assert engine.load().weight_version == VERSION + 1


def test_bad_weights_are_refused_before_vllm_sees_them(start, tiny_ckpt):
    engine = start()
    weights = load_pretrained(tiny_ckpt).state_dict()
    weights.pop(next(iter(weights)))
    with pytest.raises(RolloutError, match="missing"):
        engine.load_weights(weights, VERSION + 1)
    assert not [e for e in engine._engine.events if e[0] == "collective_rpc"]
    assert engine.load().weight_version == VERSION  # still usable


def test_vllm_refusing_a_sample_refuses_the_batch_whole(start, release):
    engine = start()
    hot = make_state(2, VERSION, temperature=2.5)
    if FAKES[release].AsyncLLM.rules.temperature_cap is None:
        run_alone(engine, [make_state(1, VERSION), hot])
        return
    with pytest.raises(RolloutError, match="sampling parameters"):
        engine.submit([make_state(1, VERSION), hot])
    assert engine.load().running + engine.load().queued == 0 and not engine._engine.requests


def test_an_abort_vllm_did_on_its_own_fails_the_engine(start):
    engine = start(abort_after_tokens=3)
    engine.submit([make_state(1, VERSION, max_new=50)])
    with pytest.raises(RolloutError, match="finish_reason 'abort'"):
        collect(engine, [1])


def test_buckets_smaller_than_a_layer_still_reload_every_fused_layer_whole(tmp_path, release):
    shape = dict(arch="qwen3", hidden_size=256, intermediate_size=1024, num_heads=8, num_kv_heads=2, head_dim=32)
    ckpt = build_tiny_checkpoint(tmp_path / "a", seed=0, **shape)  # a layer: about 3.7 MB in float32
    other = build_tiny_checkpoint(tmp_path / "b", seed=1, **shape)
    config = VLLMEngineConfig(model_path=str(ckpt), weight_version=VERSION, weight_bucket_bytes=1 << 20)
    with VLLMEngine(config, api=api_of(release)) as engine:
        engine.load_weights(load_pretrained(other).named_weights(), VERSION + 1)
        calls = [e for e in engine._engine.events if e == ("collective_rpc", "rlboost_load_weights")]
        assert len(calls) > 2  # several buckets: each layer alone
        assert UNSET not in engine._engine.digests.values()
        assert engine.load().weight_version == VERSION + 1


def test_a_start_vllm_cannot_make_is_refused_before_vllm_starts(tiny_ckpt):
    fake = FAKES["0.27"]
    cpu_build = VLLMApi(AsyncLLM=fake.AsyncLLM, AsyncEngineArgs=fake.AsyncEngineArgs,
                        SamplingParams=fake.SamplingParams, RequestOutputKind=fake.RequestOutputKind,
                        device_type="cpu", cpu_head_sizes=(32, 64, 128))
    with pytest.raises(EngineStartFailed, match=r"runs on 'cpu', rollout.vllm.device is 'cuda'") as caught:
        VLLMEngine(VLLMEngineConfig(model_path=str(tiny_ckpt)), api=cpu_build)
    assert caught.value.engine == "vLLM" and "\n" not in str(caught.value)
    with pytest.raises(EngineStartFailed, match=r"head_dim 16 is not one vLLM's CPU attention takes \(32, 64, 128\)"):
        VLLMEngine(VLLMEngineConfig(model_path=str(tiny_ckpt), device="cpu"), api=cpu_build)


def test_a_load_that_fails_in_the_workers_is_typed_and_fails_every_later_call(start, tiny_ckpt_other):
    engine = start()

    def broken(weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        raise AssertionError("Attempted to load weight (torch.Size([63])) into parameter (torch.Size([64]))")

    for worker in engine._engine.workers:
        worker.model_runner.reload_weights = broken
    with pytest.raises(WeightLoadFailed) as caught:
        engine.load_weights(load_pretrained(tiny_ckpt_other).named_weights(), VERSION + 1)
    assert str(caught.value) == (f"vLLM failed to load weight version {VERSION + 1}: AssertionError: Attempted to "
                                 "load weight (torch.Size([63])) into parameter (torch.Size([64]))")
    for call in (lambda: engine.poll(0.0), lambda: engine.submit([make_state(1, VERSION)]), engine.load):
        with pytest.raises(WeightLoadFailed, match=f"weight version {VERSION + 1}"):
            call()
