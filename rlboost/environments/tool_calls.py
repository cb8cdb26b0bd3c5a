"""The tool-call convention: a model turn that calls a tool ends with the call wrapped in an
opening and a closing tag ("[3+5]", "<tool_call>{...}</tool_call>"). Engines stop a sample
on its stop token ids, so the closing tag must be one token of the model's tokenizer (one
byte for the byte-level models; a special token such as `</tool_call>` for chat models),
and the episode driver adds it to every turn's stop tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rlboost.errors import ConfigError
from rlboost.validate import check_format_version

TOOL_CALL_FORMAT_VERSION = 1


class Encoder(Protocol):
    def encode(self, text: str, *, add_bos: bool = False) -> list[int]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallFormat:
    """The tags around a tool call at the end of a model turn.

    >>> calc = ToolCallFormat(open="[", close="]")
    >>> calc.find_call("let me compute [12*7]"), calc.find_call("84")
    ('12*7', None)
    """

    open: str
    close: str
    format_version: int = TOOL_CALL_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, TOOL_CALL_FORMAT_VERSION)
        if not self.open or not self.close:
            raise ValueError(f"tool call tags must not be empty, got open={self.open!r} close={self.close!r}")

    def find_call(self, text: str) -> str | None:
        """The argument of the call a turn ends with (the text between the last opening tag and
        the closing tag that ends the turn, trailing whitespace aside); None when the turn does
        not end with a call."""
        body = text.rstrip()
        if not body.endswith(self.close):
            return None
        body = body[:-len(self.close)]
        start = body.rfind(self.open)
        return None if start < 0 else body[start + len(self.open):]

    def stop_token_ids(self, tokenizer: Encoder) -> tuple[int, ...]:
        """The token that ends a turn at the closing tag; ConfigError (one line) when the
        tokenizer spells the tag with more than one token, which no engine can stop on."""
        ids = tokenizer.encode(self.close)
        if len(ids) != 1:
            raise ConfigError(f"the tool call's closing tag {self.close!r} is {len(ids)} tokens {ids[:8]} for this "
                              "tokenizer; engines stop on single tokens, so choose a tag that is one token (a "
                              "special token of the model, or one character for a byte-level model)")
        return (int(ids[0]),)
