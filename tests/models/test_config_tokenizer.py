"""ModelConfig reads HF config.json of every supported family; ByteTokenizer round trips."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost.models import ByteTokenizer, ModelConfig

QWEN3_HF5 = {  # layout written by transformers 5.x
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "tie_word_embeddings": True,
    "attention_bias": False, "max_position_embeddings": 40960, "eos_token_id": 151645,
    "use_sliding_window": False, "torch_dtype": "bfloat16",
}
LLAMA32_HF4 = {  # layout written by transformers 4.x, with llama3 RoPE scaling
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "eos_token_id": [128001, 128008, 128009],
    "max_position_embeddings": 131072, "mlp_bias": False, "attention_bias": False,
}
QWEN2 = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
         "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}


def test_reads_each_family():
    q3 = ModelConfig.from_hf_config(QWEN3_HF5)
    assert (q3.qk_norm, q3.qkv_bias, q3.o_bias, q3.head_dim, q3.rope_theta) == (True, False, False, 128, 1e6)
    assert q3.num_query_groups == 2 and q3.tie_word_embeddings
    ll = ModelConfig.from_hf_config(LLAMA32_HF4)
    assert ll.rope_type == "llama3" and ll.head_dim == 64 and ll.eos_token_ids == (128001, 128008, 128009)
    q2 = ModelConfig.from_hf_config(QWEN2)
    assert (q2.qkv_bias, q2.o_bias, q2.qk_norm, q2.head_dim, q2.num_query_groups) == (True, False, False, 64, 7)


@pytest.mark.parametrize("hf", [QWEN3_HF5, LLAMA32_HF4, QWEN2])
def test_config_round_trips(hf, tmp_path):
    config = ModelConfig.from_hf_config(hf)
    config.save(tmp_path)
    assert ModelConfig.load(tmp_path) == config


@pytest.mark.parametrize("change, field", [
    ({"model_type": "mistral"}, "model_type"), ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 3}, "num_attention_heads"), ({"use_sliding_window": True}, "sliding"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"), ({"hidden_size": 0}, "hidden_size"),
    # scaling schemes missing the keys they read, or with values that make no sense
    ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"rope_scaling": {**LLAMA32_HF4["rope_scaling"], "original_max_position_embeddings": None}},
     "original_max_position_embeddings"),
    ({"rope_scaling": {**LLAMA32_HF4["rope_scaling"], "low_freq_factor": 4.0}}, "below high_freq_factor"),
])
def test_unsupported_configs_are_refused(change, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_hf_config({**QWEN2, **change})


@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text, add_bos=True)
    assert ids[0] == tok.bos_id and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == text


def test_byte_tokenizer_saves_and_loads(tmp_path):
    tok = ByteTokenizer(pad_id=300, bos_id=301, eos_id=302)
    tok.save(tmp_path)
    assert ByteTokenizer.load(tmp_path) == tok and tok.vocab_size == 303
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # a cut UTF-8 sequence is replaced, not raised
    with pytest.raises(ValueError):
        ByteTokenizer(pad_id=10)
