"""What crosses between the episode driver and the environment host: a tool call (one model
turn of one sample, with its call id), the host's reply, the opening of an episode, and the
host's counters. Frozen and versioned, as everything that crosses a process is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from rlboost.environments.base import ENVIRONMENT_RECORD_FORMAT_VERSION, ModelTurn
from rlboost.environments.tool_calls import ToolCallFormat
from rlboost.environments.trajectory import ToolRecord
from rlboost.validate import check_format_version


def call_id(sample_id: int, turn: int) -> str:
    """The call id of a sample's turn when the model's text names none: the same on every
    engine, so a turn re-sent after a migration is the same call.

    >>> call_id(7, 2)
    '7/2'
    """
    return f"{sample_id}/{turn}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """One finished model turn of one sample, for its environment to answer. The host executes
    a (sample_id, turn, call_id) once; the same call again gets the recorded answer.

    >>> ToolCall(sample_id=7, turn=0, call_id="7/0",
    ...          model_turn=ModelTurn(text="[3+5]", token_ids=(91, 51, 43, 53, 93))).turn
    0
    """

    sample_id: int
    turn: int
    call_id: str
    model_turn: ModelTurn
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)
        if not 0 <= self.sample_id < 2**64 or not 0 <= self.turn < 2**31:
            raise ValueError(f"sample_id must fit in u64 and turn in [0, 2**31), got {self.sample_id}, {self.turn}")
        if not self.call_id or len(self.call_id) > 256:
            raise ValueError(f"call_id must be 1 to 256 characters, got {len(self.call_id)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolReply:
    """The host's answer to a ToolCall: the recorded step (turn, call id, result), and whether
    this call was answered without executing (replayed: the call had been executed before,
    or was executing when it came and this call waited for it).

    >>> from rlboost.environments.base import StepResult
    >>> ToolReply(record=ToolRecord(turn=0, call_id="7/0", result=StepResult(observation="8", done=False)),
    ...           replayed=False).record.result.observation
    '8'
    """

    record: ToolRecord
    replayed: bool
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeOpening:
    """An episode's start: the text of its first prompt, the tool-call tags its turns end with,
    and whether this reset was answered from the record. A failed reset (the environment
    raised or hung) has failure set and no text: the sample ends there.

    >>> EpisodeOpening(sample_id=7, text="3+5=", tool_call=ToolCallFormat(open="[", close="]"),
    ...                replayed=False).failed
    False
    """

    sample_id: int
    text: str
    tool_call: ToolCallFormat | None
    replayed: bool
    failure: str | None = None
    error: str = ""
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)

    @property
    def failed(self) -> bool:
        return self.failure is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class HostStats:
    """The host's counters. executions: environment steps run (each call at most once);
    executions_by_sample: the same for each live episode; resets: episodes started;
    replays: calls (and resets) answered from the record; joined: calls that came while the
    same call was executing and waited for its result; truncated: episodes ended by
    max_turns; failures_by_kind: steps and resets that raised ("ValueError"), hung
    ("timeout") or answered with something else ("bad result"); live: episodes held.

    >>> HostStats(executions=3, executions_by_sample={7: 3}, resets=1, replays=1, joined=0, truncated=0,
    ...           live=1).executions_by_sample[7]
    3
    """

    executions: int
    executions_by_sample: Mapping[int, int]
    resets: int
    replays: int
    joined: int
    truncated: int
    live: int
    failures_by_kind: Mapping[str, int] = field(default_factory=dict)
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)
