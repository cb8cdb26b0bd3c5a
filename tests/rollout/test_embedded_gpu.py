"""The embedded engine on a CUDA device: same tokens as on CPU, and samples migrate
between a CPU engine and a GPU engine with their KV pages."""

import pytest
import torch
from engine_contract import Collected, absorb, collect, make_state, run_alone

from rlboost.migration.batch import pack_batch, unpack_batch
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig

pytestmark = pytest.mark.gpu


@pytest.fixture
def engines(tiny_ckpt):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    made = []

    def make(**overrides):
        made.append(EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), **overrides)))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def test_gpu_engine_generates_what_the_cpu_engine_does(engines):
    states = [make_state(i, 0, prompt_len=3 + 5 * i, max_new=40, temperature=0.0) for i in range(6)]
    cpu = run_alone(engines(), states)
    gpu = run_alone(engines(device="cuda"), states)
    for s in states:
        assert gpu[s.sample_id].ids == cpu[s.sample_id].ids
        assert gpu[s.sample_id].logprobs == pytest.approx(cpu[s.sample_id].logprobs, abs=1e-3)
    half = run_alone(engines(device="cuda", dtype="bfloat16"), states)
    assert all(half[s.sample_id].finish == "length" for s in states)


def test_kv_pages_move_between_cpu_and_gpu(engines):
    state = make_state(1, 0, max_new=40, temperature=0.0)
    reference = run_alone(engines(), [state])[1]
    cpu, gpu = engines(stream_interval=1), engines(device="cuda", stream_interval=1)
    cpu.submit([state])
    out: dict[int, Collected] = {}
    while len(out.get(1, Collected()).ids) < 10:
        absorb(out, cpu.poll(5.0))
    batch = cpu.export_states([1], with_kv=True)
    out[1] = Collected(ids=list(batch.states[0].output_ids))
    gpu.import_states(unpack_batch(pack_batch(batch)))
    collect(gpu, [1], out)
    assert out[1].ids == reference.ids
