"""ByteTokenizer: 256 byte tokens plus pad/bos/eos, stored as a small JSON file beside the
checkpoint, so a tiny checkpoint directory is self-describing without any model hub.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlboost.validate import check_format_version

TOKENIZER_FILE = "byte_tokenizer.json"
TOKENIZER_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; special tokens after them.

    >>> tok = ByteTokenizer()
    >>> tok.encode("hi"), tok.decode([104, 105, tok.eos_id])
    ([104, 105], 'hi')
    >>> tok.encode("hi", add_bos=True)[0] == tok.bos_id, tok.vocab_size
    (True, 259)
    """

    pad_id: int = 256
    bos_id: int = 257
    eos_id: int = 258
    format_version: int = TOKENIZER_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, TOKENIZER_FORMAT_VERSION)
        ids = (self.pad_id, self.bos_id, self.eos_id)
        if len(set(ids)) != 3 or min(ids) < 256:
            raise ValueError(f"pad_id, bos_id, eos_id must be distinct and >= 256, got {ids}")

    @property
    def vocab_size(self) -> int:
        return max(self.pad_id, self.bos_id, self.eos_id) + 1

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids) -> str:
        """Bytes to text; special and out-of-range ids are skipped, bad UTF-8 is replaced."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"type": "byte", "format_version": self.format_version,
                                    "pad_id": self.pad_id, "bos_id": self.bos_id,
                                    "eos_id": self.eos_id}, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> ByteTokenizer:
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory}")
        data = json.loads(path.read_text())
        if data.get("type") != "byte":
            raise ValueError(f"{path}: type must be 'byte', got {data.get('type')!r}")
        return cls(pad_id=int(data["pad_id"]), bos_id=int(data["bos_id"]), eos_id=int(data["eos_id"]),
                   format_version=int(data.get("format_version", -1)))
