"""Convert a Llama-architecture GGUF file (llama.cpp's format) into an HF-style checkpoint
directory: config.json, model.safetensors and a tokenizer (tokenizer.json plus
tokenizer_config.json with the chat template), with the `gguf` and `tokenizers` packages.

Reading the file directly keeps the install light: transformers' own GGUF path needs
accelerate, and the package that ships SmolLM2's GGUF depends on a llama.cpp build.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from rlboost.models.config import ModelConfig

# llama.cpp tensor names -> HF names (per block, then the rest)
_BLOCK_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_CONTROL_TOKEN = 3  # llama.cpp's token type of special tokens such as <|im_end|>
# how llama.cpp splits text before BPE, per tokenizer.ggml.pre value (HF pre-tokenizer layouts)
_DIGITS_FIRST = {"smollm", "starcoder", "refact", "deepseek-coder"}


def convert_gguf(path: str | Path, out: str | Path, *, dtype: torch.dtype = torch.bfloat16) -> ModelConfig:
    """Write the checkpoint of a Llama GGUF file into `out` and return its config."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items()
              if not name.startswith("tokenizer.ggml.")}
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: only llama-architecture GGUF files convert, this one is {arch!r}")
    config = gguf_model_config(fields, reader)
    tensors = {}
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            continue  # e.g. rope_freqs: recomputed from the config
        weight = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # owned, writable
        weight = weight.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims innermost first
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in t.name else config.num_key_value_heads
            weight = unpermute_rotary(weight, heads)
        tensors[name] = torch.from_numpy(weight).to(dtype).contiguous()
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.extra["torch_dtype"] = str(dtype).removeprefix("torch.")
    config.save(out)
    write_gguf_tokenizer(reader, out, max_length=config.max_position_embeddings)
    return config


def gguf_model_config(fields: dict, reader) -> ModelConfig:
    """The ModelConfig of a llama GGUF file's metadata."""
    def key(name: str, default=None):
        value = fields.get(f"llama.{name}", default)
        if value is None:
            raise ValueError(f"the GGUF file has no llama.{name}")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(fields.get("llama.attention.key_length", hidden // heads))
    names = {t.name for t in reader.tensors}
    vocab = fields.get("llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    tok = reader.fields
    bos = int(tok["tokenizer.ggml.bos_token_id"].contents()) if "tokenizer.ggml.bos_token_id" in tok else None
    eos = int(tok["tokenizer.ggml.eos_token_id"].contents()) if "tokenizer.ggml.eos_token_id" in tok else None
    return ModelConfig(
        arch="llama", vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")), num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads, num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim, rope_theta=float(key("rope.freq_base", 10000.0)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in names, bos_token_id=bos, eos_token_id=eos)


def hf_tensor_name(name: str) -> str | None:
    """The HF name of a llama.cpp tensor name; None for tensors a checkpoint does not store.

    >>> hf_tensor_name("blk.3.attn_q.weight")
    'model.layers.3.self_attn.q_proj.weight'
    """
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    if name == "rope_freqs.weight":
        return None
    raise ValueError(f"unknown tensor {name!r} in the GGUF file")


def unpermute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k rows: GGUF stores each head's rotary pairs
    interleaved (0, d/2, 1, d/2+1, ...), HF stores the two halves one after the other."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf_tokenizer(reader, out: Path, *, max_length: int) -> None:
    """tokenizer.json (byte-level BPE) and tokenizer_config.json from the GGUF metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    f = reader.fields
    if f["tokenizer.ggml.model"].contents() != "gpt2":
        raise ValueError(f"only byte-level BPE (gpt2) GGUF tokenizers convert, "
                         f"not {f['tokenizer.ggml.model'].contents()!r}")
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre = f["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in f else "default"
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if pre in _DIGITS_FIRST else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == _CONTROL_TOKEN])
    tok.save(str(out / "tokenizer.json"))

    def special(name: str) -> str | None:
        field = f.get(f"tokenizer.ggml.{name}_token_id")
        return tokens[int(field.contents())] if field is not None else None

    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
                "bos_token": special("bos"), "eos_token": special("eos"), "unk_token": special("unknown"),
                "pad_token": special("padding") or special("eos"), "clean_up_tokenization_spaces": False}
    if "tokenizer.chat_template" in f:
        settings["chat_template"] = f["tokenizer.chat_template"].contents()
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
