"""Supervised warm-up batches: layout, loss mask and the loss value."""

import math

import pytest
import torch

from rlboost.models import ByteTokenizer
from rlboost.trainer.sft import build_sft_batch, encode_prompt, sft_loss

TOK = ByteTokenizer()


def test_batch_layout_puts_the_loss_on_completion_and_end_token():
    batch = build_sft_batch([("1+2=", "3"), ("9+9=", "18")], TOK)
    bos, eos, pad = TOK.bos_id, TOK.eos_id, TOK.pad_id
    assert batch.input_ids.tolist() == [
        [bos, *b"1+2=", *b"3", eos, pad],
        [bos, *b"9+9=", *b"18", eos]]
    assert batch.attention_mask.tolist() == [[1] * 7 + [0], [1] * 8]
    assert batch.loss_mask.tolist() == [[False] * 5 + [True, True, False],
                                        [False] * 5 + [True, True, True]]
    assert encode_prompt(TOK, "1+2=") == [bos, *b"1+2="]
    assert encode_prompt(TOK, "1+2=", add_bos=False) == list(b"1+2=")


class UniformForTests(torch.nn.Module):
    """Logits of zeros: every token has probability 1 / vocab."""

    def forward(self, input_ids, attention_mask=None):
        return torch.zeros(*input_ids.shape, TOK.vocab_size, requires_grad=True)


def test_loss_is_the_mean_nll_over_masked_tokens():
    batch = build_sft_batch([("1+2=", "3"), ("9+9=", "18")], TOK)
    assert sft_loss(UniformForTests(), batch).item() == pytest.approx(math.log(TOK.vocab_size))
