"""Finished samples -> padded micro-batches, group packing, and the loss of a real module."""

import math

import pytest
import torch

from rlboost.models import empty_model, tiny_config
from rlboost.models.checkpoint import init_random
from rlboost.trainer.batch import ScoredSample, build_micro_batch, micro_batch_loss
from rlboost.trainer.grpo import GRPOConfig, token_logprobs


def _tiny_model():
    return init_random(empty_model(tiny_config("qwen2", hidden_size=32, intermediate_size=64)), 0)


def _sample(sid, group, prompt, output, reward, lp=None):
    lp = lp if lp is not None else tuple(-0.5 for _ in output)
    return ScoredSample(sample_id=sid, group_id=group, prompt_ids=tuple(prompt),
                        output_ids=tuple(output), output_logprobs=tuple(lp), reward=reward)


def test_micro_batch_is_right_padded_and_aligned_to_input_ids():
    samples = [_sample(10, 0, (1, 2), (3, 4, 5), 1.0, (-0.1, -0.2, -0.3)),
               _sample(11, 0, (1,), (6,), 0.0, (-0.5,))]
    mb = build_micro_batch(samples, pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 6, 0, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert mb.response_mask.tolist() == [[False, False, True, True, True],
                                         [False, True, False, False, False]]
    torch.testing.assert_close(mb.old_logprobs, torch.tensor(
        [[0.0, 0.0, -0.1, -0.2, -0.3], [0.0, -0.5, 0.0, 0.0, 0.0]]))
    # rewards [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / sqrt(0.5)
    a = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(mb.advantages, torch.tensor([a, -a]), atol=1e-5, rtol=1e-5)
    assert mb.sample_ids == (10, 11)
    assert mb.num_response_tokens == 4
    assert mb.denominator("token_mean") == 4 and mb.denominator("seq_mean") == 2


def test_padding_rounds_up_to_a_multiple():
    mb = build_micro_batch([_sample(0, 0, (1, 2), (3,), 1.0)], pad_id=9, pad_to_multiple=4)
    assert mb.input_ids.tolist() == [[1, 2, 3, 9]]


def test_partial_groups_are_rejected_when_a_group_size_is_expected():
    samples = [_sample(0, 0, (1,), (2,), 1.0), _sample(1, 0, (1,), (2,), 0.0),
               _sample(2, 1, (1,), (2,), 0.0)]
    with pytest.raises(ValueError, match="groups must hold 2"):
        build_micro_batch(samples, pad_id=0, expected_group_size=2)


def test_sample_record_validates_its_fields():
    with pytest.raises(ValueError, match="differ in length"):
        _sample(0, 0, (1,), (2, 3), 1.0, (-0.1,))
    with pytest.raises(ValueError, match="finite"):
        _sample(0, 0, (1,), (2,), float("nan"))
    with pytest.raises(ValueError, match="output_ids"):
        _sample(0, 0, (1,), (), 1.0, ())


def test_micro_batch_loss_on_policy_and_split_across_micro_batches():
    model = _tiny_model()
    g = torch.Generator().manual_seed(1)
    raw = [_sample(i, i // 3, torch.randint(1, 60, (3 + i % 2,), generator=g).tolist(),
                   torch.randint(1, 60, (2 + i % 3,), generator=g).tolist(), float(i % 2))
           for i in range(6)]
    # Give every sample its on-policy log-probs so the importance ratio is exactly 1.
    full = build_micro_batch(raw, pad_id=0)
    with torch.no_grad():
        lp = token_logprobs(model(full.input_ids, full.attention_mask), full.input_ids,
                            full.response_mask)
    on_policy = [_sample(s.sample_id, s.group_id, s.prompt_ids, s.output_ids, s.reward,
                         lp[i][full.response_mask[i]].tolist()) for i, s in enumerate(raw)]
    cfg = GRPOConfig()
    whole = micro_batch_loss(model, build_micro_batch(on_policy, pad_id=0), cfg)
    assert whole.mean_ratio == pytest.approx(1.0, abs=1e-5)
    assert whole.clip_fraction == 0.0


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_micro_batches_with_a_step_denominator_add_up_to_the_full_batch():
    model = _tiny_model()
    g = torch.Generator().manual_seed(2)
    samples = [_sample(i, i // 3, torch.randint(1, 60, (3 + i % 2,), generator=g).tolist(),
                       torch.randint(1, 60, (2 + i % 3,), generator=g).tolist(), float(i % 2),
                       (-4.0 + 0.3 * i,) * (2 + i % 3)) for i in range(6)]
    cfg = GRPOConfig()
    full = build_micro_batch(samples, pad_id=0)
    whole = micro_batch_loss(model, full, cfg)
    whole.loss.backward()
    expected = _grads(model)
    model.zero_grad()
    total, parts = full.num_response_tokens, 0.0
    for k in (0, 3):  # one group per micro-batch, gradients accumulate
        part = micro_batch_loss(model, build_micro_batch(samples[k:k + 3], pad_id=0), cfg,
                                denominator=total)
        part.loss.backward()
        parts += part.loss.item()
    assert parts == pytest.approx(whole.loss.item(), rel=1e-5)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-6)


def test_strict_on_policy_batches_reject_other_versions():
    from rlboost.errors import StaleSampleError
    samples = [ScoredSample(sample_id=i, group_id=0, prompt_ids=(1,), output_ids=(2,),
                            output_logprobs=(-0.1,), reward=float(i), weight_version=v)
               for i, v in enumerate((3, 3, 2))]
    build_micro_batch(samples, pad_id=0)  # no version asked: accepted
    with pytest.raises(StaleSampleError, match=r"\(2, 2\)"):
        build_micro_batch(samples, pad_id=0, weight_version=3)


def test_scored_sample_from_a_finished_request_state():
    from rlboost.migration.state import RequestState, SamplingParams
    state = RequestState(sample_id=5, prompt_ids=(1, 2), params=SamplingParams(), seed=0,
                         weight_version=7, output_ids=(3, 4), output_logprobs=(-0.5, -0.25),
                         finish_reason="stop")
    s = ScoredSample.from_request(state, group_id=2, reward=1.0)
    assert (s.sample_id, s.group_id, s.prompt_ids, s.output_ids, s.output_logprobs,
            s.reward, s.weight_version) == (5, 2, (1, 2), (3, 4), (-0.5, -0.25), 1.0, 7)
    with pytest.raises(ValueError, match="still running"):
        ScoredSample.from_request(state.extended((), (), None), group_id=2, reward=0.0)


def test_reference_logprobs_feed_the_kl_term():
    from rlboost.trainer.batch import reference_logprobs
    model = _tiny_model()
    samples = [_sample(i, 0, (1, 2, 3), (4, 5), float(i)) for i in range(2)]
    batch = build_micro_batch(samples, pad_id=0)
    ref = reference_logprobs(model, batch)
    assert not ref.requires_grad and ref.shape == batch.input_ids.shape
    out = micro_batch_loss(model, batch, GRPOConfig(kl_coef=0.5), ref_logprobs=ref)
    assert out.kl == pytest.approx(0.0, abs=1e-6)  # the policy is its own reference


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_samples_the_engine_drew_at_any_temperature_are_on_policy(tmp_path, temperature):
    from rlboost.migration.state import RequestState, SamplingParams
    from rlboost.models import build_tiny_checkpoint, load_pretrained
    from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig

    ckpt = build_tiny_checkpoint(tmp_path, seed=0)
    states = [RequestState(sample_id=i, prompt_ids=(257, 10 + i, 20), seed=1, weight_version=0,
                           params=SamplingParams(temperature=temperature, max_new_tokens=12)) for i in range(6)]
    out = {}
    with EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(ckpt), stream_interval=12)) as engine:
        engine.submit(states)
        while sum(1 for v in out.values() if v.finished) < len(states):
            for d in engine.poll(5.0):
                s = out.get(d.sample_id, states[d.sample_id])
                out[d.sample_id] = s.extended(d.ids, d.logprobs, d.finish_reason)
    samples = [ScoredSample.from_request(out[i], group_id=0, reward=float(i % 2)) for i in range(6)]
    batch = build_micro_batch(samples, pad_id=256)
    assert batch.temperature == temperature
    loss = micro_batch_loss(load_pretrained(ckpt), batch, GRPOConfig())
    assert loss.mean_ratio == pytest.approx(1.0, abs=1e-4)
    assert loss.clip_fraction == 0.0


def test_samples_drawn_at_different_temperatures_are_not_mixed():
    hot = ScoredSample(sample_id=0, group_id=0, prompt_ids=(1,), output_ids=(2,), output_logprobs=(-1.0,),
                       reward=1.0, temperature=0.7)
    cold = ScoredSample(sample_id=1, group_id=0, prompt_ids=(1,), output_ids=(3,), output_logprobs=(-1.0,),
                        reward=0.0, temperature=1.0)
    with pytest.raises(ValueError, match="temperature"):
        build_micro_batch([hot, cold], pad_id=0)
    with pytest.raises(ValueError, match="temperature"):
        ScoredSample(sample_id=2, group_id=0, prompt_ids=(1,), output_ids=(3,), output_logprobs=(-1.0,),
                     reward=0.0, temperature=-1.0)
