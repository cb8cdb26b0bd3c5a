"""The timing model: its rooflines integrate what a step-by-step sum gives, its inverse
inverts, and the model's table holds the figures its sources state."""

from __future__ import annotations

import pytest

from rlboost.timing import EFFICIENCY, GpuTiming, accelerator, gpu_timing, model_shape, startup_s, transfer_s


def test_qwen3_8b_shape_matches_its_config():
    m = model_shape("qwen3-8b")
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    assert m.weight_bytes == pytest.approx(16.4e9)
    # the untied input embedding is a lookup: out of the FLOPs and the bytes a step reads
    assert m.matmul_params == pytest.approx(8.2e9 - 151_936 * 4_096)
    assert model_shape("qwen3-1.7b").matmul_params == model_shape("qwen3-1.7b").params  # tied: the LM head


@pytest.mark.parametrize("batch,context,steps", [(1, 0, 5000), (256, 256 * 800, 700), (600, 600 * 50, 900),
                                                 (64, 64 * 9000, 300)])
def test_decode_time_is_the_sum_of_its_steps(batch, context, steps):
    t = gpu_timing("qwen3-8b", "h100-sxm", 2)
    brute = sum(t.decode_step_s(batch, context + batch * i) for i in range(steps))
    assert t.decode_time_s(batch, context, steps) == pytest.approx(brute, rel=2e-3)
    assert t.decode_steps_in(batch, context, t.decode_time_s(batch, context, steps)) == pytest.approx(steps, rel=1e-9)


def test_a_lone_sample_is_bound_by_reading_the_weights():
    t = GpuTiming(model_shape("qwen3-8b"), accelerator("h100-sxm"), gpus=2, efficiency=1.0)
    assert t.decode_step_s(1, 0) == pytest.approx((8.2e9 - 151_936 * 4_096) * 2 / (2 * 3.35e12))
    # a long cache makes the step slower: its KV is read every step
    assert t.decode_step_s(64, 64 * 8000) > 5 * t.decode_step_s(64, 0)


def test_training_time_grows_with_tokens_and_their_squares():
    t = gpu_timing("qwen3-8b", "h100-sxm", 8)
    one = t.train_s(1, 1000.0, 1000.0 ** 2)
    assert t.train_s(2, 2000.0, 2 * 1000.0 ** 2) == pytest.approx(2 * one)
    assert t.train_s(1, 2000.0, 2000.0 ** 2) > 2 * one  # attention is quadratic in a sequence


def test_fixed_figures_and_bad_input():
    assert 0 < EFFICIENCY <= 1 and startup_s() > 0
    assert transfer_s(25e9) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="model must be one of"):
        model_shape("gpt-5")
    with pytest.raises(ValueError, match="gpus"):
        gpu_timing("qwen3-8b", "h100-sxm", 0)
    with pytest.raises(ValueError, match="efficiency"):
        gpu_timing("qwen3-8b", "h100-sxm", 1, efficiency=1.5)
