"""An emulated engine's token statistics fitted to the model a run trains, so the trainer
can score the emulated tokens and a task's stop tokens end samples."""

from __future__ import annotations

import dataclasses

from rlboost.models.hf import eos_token_ids, read_hf_config
from rlboost.models.tokenizers import load_tokenizer
from rlboost.rollout.emulated.config import EmulatedEngineConfig


def fitted_to(config: EmulatedEngineConfig, model_dir: str) -> EmulatedEngineConfig:
    """config with the model's vocabulary, end-of-sequence token and context length. The
    vocabulary is capped at the tokenizer's when one lies beside the checkpoint: a model's
    embedding table may hold rows no token decodes to."""
    hf = read_hf_config(model_dir)  # any architecture: an emulated engine needs only these facts
    vocab, eos = int(hf["vocab_size"]), (eos_token_ids(hf) or (None,))[0]
    try:
        tokenizer = load_tokenizer(model_dir)
        vocab, eos = min(vocab, tokenizer.vocab_size), tokenizer.eos_id
    except FileNotFoundError:  # weights only: the model's own config has to do
        pass
    if eos is None or not 0 <= eos < vocab:
        raise ValueError(f"{model_dir}: the model names no end-of-sequence token below its vocabulary "
                         f"size {vocab}, which emulated samples need to stop")
    return dataclasses.replace(config, vocab_size=vocab, eos_token_id=eos,
                               max_model_len=config.max_model_len or int(hf.get("max_position_embeddings", 32768)))
