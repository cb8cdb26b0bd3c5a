"""One sample as vLLM requests: what `AsyncLLM.generate` is asked, and how its streamed
outputs become output tokens. Pure functions and a plain record, tested without vLLM.

A request's prompt is prompt + output so far as token ids ({"prompt_token_ids": [...]}),
max_tokens what is left, stop_token_ids exactly the sample's (ignore_eos, so the model's own
EOS is no stop unless listed; a sample without stop tokens runs to max_new_tokens), one
log-prob per token (the sampled one) and outputs as deltas. With `seeded` the request's seed
derives from (seed, sample_id).

An output is a RequestOutput whose outputs[0] holds token_ids (the new ones, DELTA),
logprobs (one {token_id: Logprob} per token), finish_reason (None, "stop", "length",
"abort") and stop_reason (the stop token id).
"""

from __future__ import annotations

from typing import Any

from rlboost.errors import RolloutError
from rlboost.rollout.server.sample import Pairs, StreamedSample, sampling_seed

__all__ = ["VLLMSample", "finish_of", "new_pairs", "request_id"]


def request_id(prefix: str, serial: int, sample_id: int) -> str:
    """The request id of one vLLM request (vLLM aborts by exact id; each request gets its own).

    >>> request_id("rlboost-0a1b2c3d", 3, 5)
    'rlboost-0a1b2c3d-5-3'
    """
    return f"{prefix}-{int(sample_id)}-{serial}"


class VLLMSample(StreamedSample):
    """An admitted sample as vLLM requests (see StreamedSample)."""

    __slots__ = ()

    def sampling_kwargs(self, *, seeded: bool, delta_kind: Any) -> dict[str, Any]:
        """`SamplingParams` arguments continuing this sample from its last token."""
        p = self.state.params
        kwargs: dict[str, Any] = {
            "n": 1, "max_tokens": self.remaining, "temperature": p.temperature, "top_p": p.top_p,
            "top_k": p.top_k if p.top_k > 0 else 0, "stop_token_ids": list(p.stop_token_ids),
            "ignore_eos": True, "logprobs": 0, "detokenize": False, "skip_special_tokens": False,
            "output_kind": delta_kind,
        }
        if seeded:
            kwargs["seed"] = sampling_seed(self.state.seed, self.sample_id)
        return kwargs

    def prompt(self) -> dict[str, list[int]]:
        """Prompt + output so far, re-prefilled."""
        s = self.current()
        return {"prompt_token_ids": [*s.prompt_ids, *s.output_ids]}


def new_pairs(sample: VLLMSample, output: Any) -> tuple[Pairs, str | None]:
    """(token id, logprob) pairs a streamed output adds, and its finish_reason."""
    try:
        (completion,) = output.outputs
        ids, logprobs = list(completion.token_ids), completion.logprobs
        reason = completion.finish_reason
    except (AttributeError, TypeError, ValueError) as e:
        raise RolloutError(f"vLLM output for sample {sample.sample_id} is not one completion with token "
                           f"ids: {output!r:.300}") from e
    if logprobs is None or len(logprobs) != len(ids):
        raise RolloutError(f"vLLM output for sample {sample.sample_id} holds {len(ids)} tokens and "
                           f"{None if logprobs is None else len(logprobs)} logprob entries (logprobs=0 was set)")
    try:
        pairs = [(int(t), float(pos[t].logprob)) for t, pos in zip(ids, logprobs)]
    except (KeyError, AttributeError, TypeError) as e:
        raise RolloutError(f"vLLM output for sample {sample.sample_id} lacks the sampled token's logprob") from e
    return pairs, reason


def finish_of(sample: VLLMSample, reason: str | None) -> str | None:
    """The sample's finish for a request's finish_reason: "stop", "length" or None (still
    running). An abort that rlboost did not ask for raises RolloutError."""
    if reason is None:
        return None
    if reason in ("stop", "length"):
        return reason
    raise RolloutError(f"vLLM ended sample {sample.sample_id} (request {sample.rid}) with finish_reason {reason!r}")
