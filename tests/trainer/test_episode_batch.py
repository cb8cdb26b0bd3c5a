"""An episode's observations are in its output but not in its loss: the response mask and the
behaviour log-probabilities cover the model's tokens only, padded or packed."""

import pytest
import torch

from rlboost.trainer.batch import ScoredSample, build_micro_batch
from rlboost.trainer.split import pack_rows


def episode(sid, reward):
    return ScoredSample(sample_id=sid, group_id=0, prompt_ids=(1, 2), output_ids=(5, 6, 7, 8, 9),
                        output_logprobs=(-0.5, -0.5, 0.0, 0.0, -0.25), reward=reward,
                        model_mask=(True, True, False, False, True))


def test_observation_tokens_are_left_out_of_the_loss():
    batch = build_micro_batch([episode(0, 1.0), episode(1, 0.0)], pad_id=0)
    want = torch.tensor([False, False, True, True, False, False, True])
    assert torch.equal(batch.response_mask[0], want) and batch.num_response_tokens == 6
    assert batch.old_logprobs[0].tolist() == [0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.25]
    packed = pack_rows(batch, [0, 1])
    assert torch.equal(packed.response_mask[0], torch.cat([want, want]))


def test_a_mask_must_cover_the_output_and_hold_a_model_token():
    with pytest.raises(ValueError, match="model_mask"):
        ScoredSample(sample_id=0, group_id=0, prompt_ids=(1,), output_ids=(5, 6), output_logprobs=(0.0, 0.0),
                     reward=0.0, model_mask=(False, False))
