"""The timing model: its inputs come from the measurements they name and reproduce them, its
decode integrates what a step-by-step sum gives and its inverse inverts, and the model table
holds the shapes their configs state."""

from __future__ import annotations

import copy

import pytest

from rlboost.timing import (
    _DATA,
    INPUTS,
    GpuTiming,
    accelerator,
    allreduce_s,
    derive_inputs,
    gpu_timing,
    mean_context,
    model_shape,
    startup_s,
    transfer_s,
)


@pytest.mark.parametrize("name,params,non_embedding", [("qwen3-8b", 8.2e9, 6.95e9), ("qwen3-14b", 14.8e9, 13.2e9),
                                                       ("qwen3-32b", 32.8e9, 31.2e9), ("qwen2.5-7b", 7.6e9, 6.5e9)])
def test_parameter_counts_follow_from_the_shapes_as_the_model_cards_state(name, params, non_embedding):
    m = model_shape(name)
    assert m.params == pytest.approx(params, rel=0.01)
    untied = 0 if m.tied else 2
    assert m.params - untied * m.embedding_params == pytest.approx(non_embedding, rel=0.01)
    assert m.matmul_params == m.params - m.embedding_params  # the untied input embedding is a lookup


def test_qwen3_kv_bytes_per_token_match_their_configs():
    assert model_shape("qwen3-8b").kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    assert model_shape("qwen3-32b").kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert model_shape("qwen3-1.7b").matmul_params == model_shape("qwen3-1.7b").params  # tied: the LM head


def test_decode_reproduces_the_measured_engine_and_predicts_its_full_pool_within_3_percent():
    d, t = _DATA["decode"], gpu_timing("qwen3-8b", "h100-sxm", 1)
    for point in d["points"]:  # the points the line goes through
        assert t.decode_step_s(point[0], mean_context(point)) * 1e3 == pytest.approx(point[3], rel=0.03)
    for point in d["full_pool_points"]:  # not used: the pool holds pool / mean length sequences
        running = d["full_pool_tokens"] / (point[1] + point[2] / 2.0)
        assert t.decode_step_s(running, d["full_pool_tokens"]) * 1e3 == pytest.approx(point[3], rel=0.03)


def test_efficiencies_are_those_of_the_named_measurements():
    assert INPUTS.weights_read == pytest.approx(0.67, abs=0.01)
    assert INPUTS.kv_read == pytest.approx(0.89, abs=0.01)
    assert INPUTS.per_sequence_s == pytest.approx(12e-6, rel=0.05)
    assert INPUTS.train == pytest.approx(0.387, abs=0.005)  # verl: 6 forward equivalents in 46.13 s
    assert INPUTS.step_overhead_s == 6.0
    # a changed measurement changes its input, and only that one
    data = copy.deepcopy(_DATA)
    data["training"]["passes"][2][2] *= 2  # update_actor twice as slow
    slower = derive_inputs(data)
    assert slower.train < INPUTS.train and slower.forward == INPUTS.forward and slower.kv_read == INPUTS.kv_read


def test_tensor_parallel_communication_is_its_own_term():
    one, two = gpu_timing("qwen3-8b", "h100-sxm", 1), gpu_timing("qwen3-8b", "h100-sxm", 2)
    assert one.comm_s(256) == 0.0
    # 2 all-reduces x 36 layers of 256 x 4096 bf16 values (2 MiB: 12.5 us measured at TP 2)
    assert two.comm_s(256) == pytest.approx(72 * 12.5e-6, rel=1e-6)
    assert allreduce_s(2048, 2) == pytest.approx(3.7e-6)
    assert allreduce_s(16 << 20, 2) > allreduce_s(4 << 20, 2)  # past the table: along its last segment
    assert two.decode_step_s(256, 0) == pytest.approx(one.weights_read_s() / 2 + 256 * INPUTS.per_sequence_s
                                                      + two.comm_s(256))


@pytest.mark.parametrize("batch,context,steps", [(1, 0, 5000), (256, 256 * 800, 700), (600, 600 * 50, 900),
                                                 (64, 64 * 9000, 300)])
def test_decode_time_is_the_sum_of_its_steps(batch, context, steps):
    t = gpu_timing("qwen3-8b", "h100-sxm", 2)
    brute = sum(t.decode_step_s(batch, context + batch * i) for i in range(steps))
    assert t.decode_time_s(batch, context, steps) == pytest.approx(brute, rel=2e-3)
    assert t.decode_steps_in(batch, context, t.decode_time_s(batch, context, steps)) == pytest.approx(steps, rel=1e-9)


def test_training_time_grows_with_tokens_and_their_squares():
    t = gpu_timing("qwen3-8b", "h100-sxm", 8)
    one = t.train_s(1, 1000.0, 1000.0 ** 2)
    assert t.train_s(2, 2000.0, 2 * 1000.0 ** 2) == pytest.approx(2 * one)
    assert t.train_s(1, 2000.0, 2000.0 ** 2) > 2 * one  # attention is quadratic in a sequence


def test_scale_is_a_what_if_on_every_efficiency():
    m, gpu = model_shape("qwen3-8b"), accelerator("h100-sxm")
    half, full = GpuTiming(m, gpu, 2, scale=0.5), GpuTiming(m, gpu, 2)
    assert half.weights_read_s() == pytest.approx(2 * full.weights_read_s())
    assert half.train_s(1, 1e4, 1e8) == pytest.approx(2 * full.train_s(1, 1e4, 1e8))
    assert half.comm_s(64) == full.comm_s(64)  # a measured latency, not an efficiency


def test_fixed_figures_and_bad_input():
    assert startup_s() == 75.0
    assert transfer_s(25e9) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="model must be one of"):
        model_shape("gpt-5")
    with pytest.raises(ValueError, match="gpus"):
        gpu_timing("qwen3-8b", "h100-sxm", 0)
    with pytest.raises(ValueError, match="scale"):
        gpu_timing("qwen3-8b", "h100-sxm", 1, scale=1.5)
