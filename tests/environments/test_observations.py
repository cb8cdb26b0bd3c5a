"""Observations become the next turn's prompt tokens: as plain text after the model's turn for
a model without a chat template; for a chat model, in its template's markup, which closes the
model's turn, holds the observation as a tool message and opens the next turn."""

from __future__ import annotations

import pytest

from rlboost.environments.observations import ChatObservations, PlainObservations
from rlboost.errors import ConfigError
from rlboost.models.byte_tokenizer import ByteTokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
STRICT = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
          "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
          "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")


def _chat_tokenizer(tmp_path, template: str):
    """A real Hugging Face tokenizer (a byte-level BPE with ChatML's special tokens), saved and
    loaded as rlboost loads a checkpoint's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlboost.models.tokenizers import HFTokenizer

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                 additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    hf.chat_template = template
    hf.save_pretrained(tmp_path)
    return HFTokenizer(tmp_path)


def test_plain_text_follows_the_models_turn():
    text = PlainObservations(ByteTokenizer())
    assert text.prompt("3+5=") == [257, 51, 43, 53, 61]
    assert text.observation("8", turn_ids=(91, 93)) == [56]


def test_a_chat_observation_closes_the_turn_holds_a_tool_message_and_opens_the_next(tmp_path):
    tok = _chat_tokenizer(tmp_path, CHATML)
    chat = ChatObservations(tok)
    end = tok.encode("<|im_end|>")
    assert len(end) == 1
    after_call = chat.observation("42", turn_ids=(70, 71))
    assert after_call == tok.encode("<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    assert after_call[0] == end[0] and after_call.count(end[0]) == 2
    after_end = chat.observation("42", turn_ids=(70, end[0]))  # the model closed its turn itself
    assert after_end == after_call[1:]
    assert chat.prompt("3+5?") == tok.encode("<|im_start|>user\n3+5?<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_without_room_for_the_role_is_one_line_at_start(tmp_path):
    tok = _chat_tokenizer(tmp_path, STRICT)
    with pytest.raises(ConfigError, match="cannot hold an observation as a 'tool' message .*choose another role"):
        ChatObservations(tok)
