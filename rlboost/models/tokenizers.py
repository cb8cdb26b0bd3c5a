"""Tokenizers behind one small interface (the ByteTokenizer's): encode, decode, eos_id,
pad_id, bos_id, vocab_size, plus chat_prompt for chat models.

A checkpoint directory says which it needs: byte_tokenizer.json for rlboost's tiny
models, a Hugging Face tokenizer (tokenizer.json, ...) otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

from rlboost import env
from rlboost.models.byte_tokenizer import TOKENIZER_FILE, ByteTokenizer


class Tokenizer(Protocol):
    eos_id: int
    pad_id: int
    bos_id: int | None
    vocab_size: int

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFTokenizer:
    """A Hugging Face tokenizer seen through the ByteTokenizer's interface.

    bos_id is set only when the tokenizer itself starts sequences with it (Llama-style);
    pad_id falls back to eos_id for tokenizers without a pad token. decode drops
    special tokens, so a completion's text never includes the end-of-turn marker.
    """

    def __init__(self, directory: str | Path):
        env.apply_hf_defaults()
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(directory))
        tok = self._tok
        if tok.eos_token_id is None:
            raise ValueError(f"the tokenizer in {directory} has no end-of-sequence token")
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        plain = tok("a")["input_ids"]
        adds_bos = tok.bos_token_id is not None and plain and plain[0] == tok.bos_token_id
        self.bos_id = int(tok.bos_token_id) if adds_bos else None
        self.vocab_size = len(tok)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=False))
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def chat_prompt(self, text: str) -> list[int]:
        """Token ids of a one-turn chat (user: text) ending where the assistant's answer starts."""
        out = self._tok.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in ids]

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
        """The chat template's text of a conversation ([{"role": ..., "content": ...}, ...])."""
        return self._tok.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                             tokenize=False)

    def save(self, directory: str | Path) -> None:
        self._tok.save_pretrained(str(directory))


def load_tokenizer(directory: str | Path) -> ByteTokenizer | HFTokenizer:
    """The tokenizer stored beside a checkpoint."""
    if (Path(directory) / TOKENIZER_FILE).is_file():
        return ByteTokenizer.load(directory)
    if any((Path(directory) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return HFTokenizer(directory)
    raise FileNotFoundError(f"{directory} holds no tokenizer ({TOKENIZER_FILE} or tokenizer.json)")
