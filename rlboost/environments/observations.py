"""How an episode's texts become the model's tokens: its first prompt, and each observation as
the prompt tokens of the next turn. A model without a chat template reads observations as
plain text after its own turn; a chat model reads each one as a message of its own (the
"tool" role by default) in its template's markup, which also closes the model's turn and
opens the next one. Token ids go in as they are: nothing the model wrote is re-tokenized.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from rlboost.errors import ConfigError

_MARK = "\ue000rlboost-turn\ue001"  # a private-use string no template alters or emits


class TextTokenizer(Protocol):
    def encode(self, text: str, *, add_bos: bool = False) -> list[int]: ...


class ChatTokenizer(TextTokenizer, Protocol):
    def chat_prompt(self, text: str) -> list[int]: ...

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str: ...


class PlainObservations:
    """Texts as the tokenizer encodes them: the first prompt after the start token, each
    observation right after the model's turn.

    >>> from rlboost.models.byte_tokenizer import ByteTokenizer
    >>> text = PlainObservations(ByteTokenizer())
    >>> text.prompt("3+5="), text.observation("8")
    ([257, 51, 43, 53, 61], [56])
    """

    def __init__(self, tokenizer: TextTokenizer):
        self.tokenizer = tokenizer

    def prompt(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_bos=True))

    def observation(self, text: str, *, turn_ids: Sequence[int] = ()) -> list[int]:
        return list(self.tokenizer.encode(text))


class ChatObservations:
    """Texts in the chat template's markup: the first prompt as the user's message, each
    observation as a message of `role` that follows the model's turn, ending where the
    model's next turn starts. The observation's tokens are the template's text between the
    end of the model's message and the start of its next one, so they hold whatever the
    template puts there (the end-of-turn token, the role's header, the observation, the
    assistant's header). When the model's turn already ended with the end-of-turn token
    (it stopped on its own), that token is not repeated.
    """

    def __init__(self, tokenizer: ChatTokenizer, *, role: str = "tool"):
        self.tokenizer, self.role = tokenizer, role
        try:
            self._suffix("probe")
        except ConfigError:
            raise
        except Exception as e:  # the template refuses the role, or has no place for it
            raise ConfigError(f"the chat template cannot hold an observation as a {role!r} message "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:160]}); choose another role "
                              "(\"user\" works with every template)") from None

    def prompt(self, text: str) -> list[int]:
        return list(self.tokenizer.chat_prompt(text))

    def observation(self, text: str, *, turn_ids: Sequence[int] = ()) -> list[int]:
        ids = list(self.tokenizer.encode(self._suffix(text)))
        if turn_ids and ids and ids[0] == turn_ids[-1]:
            del ids[0]
        return ids

    def _suffix(self, text: str) -> str:
        chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK},
                {"role": self.role, "content": text}]
        rendered = self.tokenizer.render_chat(chat, add_generation_prompt=True)
        at = rendered.find(_MARK)
        if at < 0 or text not in rendered[at:]:
            raise ConfigError(f"the chat template does not render an assistant's message followed by a "
                              f"{self.role!r} message verbatim, so observations have no place in it")
        return rendered[at + len(_MARK):]
