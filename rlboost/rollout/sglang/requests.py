"""One sample as SGLang requests: what `Engine.async_generate` is asked, and how its streamed
chunks become output tokens. Pure functions and a plain record, so the mapping is tested
without SGLang.

A request's input_ids are prompt + output so far, max_new_tokens what is left, and its
sampling_seed derives from (seed, sample_id): with deterministic inference SGLang draws
token t from (sampling_seed, position), so a sample resumed by re-prefill draws the same
random numbers. Stop tokens are exactly the sample's stop_token_ids (kept in the output): a
sample without them runs to max_new_tokens (ignore_eos), and one SGLang stops on the model's
own EOS, not among them, is continued by a new request. Logprobs are SGLang's
output_token_logprobs.

A streamed chunk is `{"output_ids": [...], "meta_info": {"id": rid, "finish_reason": None |
{"type": "stop", "matched": id} | {"type": "length", "length": n} | {"type": "abort", ...},
"completion_tokens": n, "output_token_logprobs": [(logprob, token_id, text | None), ...]}}`.
By default SGLang streams cumulative lists; with `incremental_streaming_output` each chunk
holds only the new entries. Both are read.
"""

from __future__ import annotations

from typing import Any

from rlboost.errors import RolloutError
from rlboost.rollout.server.sample import Pairs, StreamedSample, cut_at_stop, sampling_seed

__all__ = ["SGLangSample", "cut_at_stop", "finish_of", "new_entries", "request_id", "sampling_seed"]

_SERIAL_DIGITS = 16


def request_id(prefix: str, serial: int, sample_id: int) -> str:
    """The rid of one SGLang request. SGLang's scheduler aborts every request whose rid
    *starts with* the rid it is given, so no rid may be a prefix of another (`...-5-3` is a
    prefix of `...-5-31`). Here the serial comes last, in a fixed width: two rids of one
    sample have the same length, and two rids of different samples differ at or right
    after the shorter sample id (a '-' against a digit).

    >>> request_id("rlboost-0a1b2c3d", 3, 5)
    'rlboost-0a1b2c3d-5-0000000000000003'
    """
    if not 0 <= serial < 16 ** _SERIAL_DIGITS:
        raise ValueError(f"serial must be in [0, 16**{_SERIAL_DIGITS}), got {serial}")
    return f"{prefix}-{int(sample_id)}-{serial:0{_SERIAL_DIGITS}x}"


class SGLangSample(StreamedSample):
    """An admitted sample as SGLang requests (see StreamedSample); a request stopped by a
    token that is not among the sample's stop tokens (the model's own EOS) is continued by a
    new request."""

    __slots__ = ()

    def generate_kwargs(self, *, seeded: bool) -> dict[str, Any]:
        """`Engine.async_generate` arguments continuing this sample from its last token:
        prompt + output so far re-prefilled, max_new_tokens reduced by what exists."""
        s = self.current()
        p = s.params
        params: dict[str, Any] = {
            "max_new_tokens": self.remaining, "temperature": p.temperature, "top_p": p.top_p,
            "top_k": p.top_k if p.top_k > 0 else -1, "stop_token_ids": list(p.stop_token_ids),
            # No stop tokens: run to the length. Otherwise SGLang also stops on the model's EOS,
            # and such a stop is continued (see finish_of).
            "ignore_eos": not p.stop_token_ids, "no_stop_trim": True,
        }
        if seeded:
            params["sampling_seed"] = sampling_seed(s.seed, s.sample_id)
        return {"input_ids": [*s.prompt_ids, *s.output_ids], "sampling_params": params,
                "return_logprob": True, "logprob_start_len": -1, "stream": True, "rid": self.rid}


def new_entries(sample: SGLangSample, meta: dict) -> Pairs:
    """(token id, logprob) pairs a chunk adds to the current request's output."""
    try:
        total = int(meta["completion_tokens"])
        entries = meta["output_token_logprobs"]
    except (KeyError, TypeError, ValueError) as e:
        raise RolloutError(f"SGLang chunk for sample {sample.sample_id} lacks completion_tokens or "
                           f"output_token_logprobs (return_logprob was set): {meta!r:.300}") from e
    have = len(sample.ids) - sample.segment_start
    if len(entries) == total >= have:        # cumulative (SGLang's default)
        fresh = entries[have:]
    elif len(entries) == total - have >= 0:  # incremental_streaming_output
        fresh = entries
    else:
        raise RolloutError(f"SGLang chunk for sample {sample.sample_id} holds {len(entries)} logprob "
                           f"entries for {total} tokens, {have} of them already received")
    return [(int(e[1]), float(e[0])) for e in fresh]


def finish_of(sample: SGLangSample, reason: dict | None) -> str | None:
    """The sample's finish for a request's finish_reason: "stop", "length", "continue" (the
    request ended on a stop this sample does not have, with tokens left to generate) or
    None (still running). An abort that rlboost did not ask for raises RolloutError."""
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else None
    if kind == "length":
        return "length"
    if kind == "stop" and isinstance(reason.get("matched"), int):
        if reason["matched"] in sample.state.params.stop_token_ids:
            return "stop"
        return "continue" if sample.remaining > 0 else "length"
    raise RolloutError(f"SGLang ended sample {sample.sample_id} (request {sample.rid}) with "
                       f"finish_reason {reason!r}")
