"""Trajectory: one multi-turn episode as the trainer and a migration see it: every token in
order (the prompt, the model's turns, the observations between them), which of them the
model produced (the loss is taken on those only), the behaviour log-probability and weight
version of each model token, the index of the turn in progress, the handle of its
environment and the tool results recorded for it.

A turn in progress is not part of the trajectory: the engine generates it as an ordinary
sample whose prompt is the trajectory's tokens so far (Trajectory.context), so a preempted
turn migrates as a RequestState does today, and is appended whole when it finishes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from rlboost.environments.base import ENVIRONMENT_RECORD_FORMAT_VERSION, StepResult
from rlboost.validate import check_format_version

TRAJECTORY_FORMAT_VERSION = 1
NOT_MODEL = -1  # the weight version of a token the model did not produce


@dataclass(frozen=True, kw_only=True, slots=True)
class EnvironmentHandle:
    """Where a sample's environment lives: the host actor's name and the sample's id there.

    >>> EnvironmentHandle(host="rlboost-environments", sample_id=7, environment="calculator").sample_id
    7
    """

    host: str
    sample_id: int
    environment: str
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)
        if not 0 <= self.sample_id < 2**64:
            raise ValueError(f"sample_id must fit in u64, got {self.sample_id}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolRecord:
    """One executed step of an episode as the host recorded it: the model turn it answered,
    the call's id and the result.

    >>> ToolRecord(turn=0, call_id="7/0", result=StepResult(observation="8", done=False)).result.observation
    '8'
    """

    turn: int
    call_id: str
    result: StepResult
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)
        if self.turn < 0 or not self.call_id:
            raise ValueError(f"turn must be >= 0 and call_id non-empty, got {self.turn}, {self.call_id!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Trajectory:
    """An episode so far. token_ids, model_mask, logprobs and versions hold one entry per
    token; logprobs is 0.0 and versions NOT_MODEL (-1) where the model did not write the
    token. turn: model turns completed (the index of the next one). prompt_len: tokens of
    the first prompt.

    >>> h = EnvironmentHandle(host="env", sample_id=7, environment="calculator")
    >>> t = Trajectory.start(h, (257, 51, 43, 53, 61))
    >>> t = t.with_model_turn((91, 51, 43, 53, 93), (-0.5,) * 5, weight_version=3)
    >>> t = t.with_observation(ToolRecord(turn=0, call_id="7/0", result=StepResult(observation="8", done=False)),
    ...                        (56,))
    >>> t.turn, len(t.token_ids), sum(t.model_mask), t.context[-1]
    (1, 11, 5, 56)
    """

    handle: EnvironmentHandle
    token_ids: tuple[int, ...]
    model_mask: tuple[bool, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    prompt_len: int
    turn: int = 0
    tool_results: tuple[ToolRecord, ...] = ()
    done: bool = False
    format_version: int = TRAJECTORY_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, TRAJECTORY_FORMAT_VERSION)
        n = len(self.token_ids)
        if not (len(self.model_mask) == len(self.logprobs) == len(self.versions) == n):
            raise ValueError(f"sample {self.handle.sample_id}: token_ids ({n}), model_mask ({len(self.model_mask)}), "
                             f"logprobs ({len(self.logprobs)}) and versions ({len(self.versions)}) differ in length")
        if not 1 <= self.prompt_len <= n or any(self.model_mask[:self.prompt_len]):
            raise ValueError(f"sample {self.handle.sample_id}: prompt_len must be in [1, {n}] and cover no model "
                             f"token, got {self.prompt_len}")
        if any(m != (v != NOT_MODEL) for m, v in zip(self.model_mask, self.versions)):
            raise ValueError(f"sample {self.handle.sample_id}: a model token needs a weight version and "
                             "only model tokens have one")
        if self.turn < 0 or [r.turn for r in self.tool_results] != sorted({r.turn for r in self.tool_results}):
            raise ValueError(f"sample {self.handle.sample_id}: turn must be >= 0 and tool results in turn order")

    @classmethod
    def start(cls, handle: EnvironmentHandle, prompt_ids: tuple[int, ...]) -> Trajectory:
        n = len(prompt_ids)
        return cls(handle=handle, token_ids=tuple(prompt_ids), model_mask=(False,) * n, logprobs=(0.0,) * n,
                   versions=(NOT_MODEL,) * n, prompt_len=n)

    @property
    def context(self) -> tuple[int, ...]:
        """The prompt of the next model turn: every token so far."""
        return self.token_ids

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)

    def with_model_turn(self, ids: tuple[int, ...], logprobs: tuple[float, ...], *, weight_version: int,
                        versions: tuple[int, ...] | None = None) -> Trajectory:
        """The trajectory with a finished model turn appended (turn advances by one).
        versions: one per token when the turn spans a weight update (else weight_version)."""
        self._open()
        if not ids or len(ids) != len(logprobs) or (versions is not None and len(versions) != len(ids)):
            raise ValueError(f"sample {self.handle.sample_id}: a model turn needs tokens and one logprob "
                             f"(and version) per token, got {len(ids)}, {len(logprobs)}")
        per_token = tuple(versions) if versions is not None else (weight_version,) * len(ids)
        if NOT_MODEL in per_token:
            raise ValueError(f"sample {self.handle.sample_id}: weight version {NOT_MODEL} is reserved")
        return dataclasses.replace(
            self, token_ids=self.token_ids + tuple(ids), model_mask=self.model_mask + (True,) * len(ids),
            logprobs=self.logprobs + tuple(float(x) for x in logprobs), versions=self.versions + per_token,
            turn=self.turn + 1)

    def with_observation(self, record: ToolRecord, ids: tuple[int, ...]) -> Trajectory:
        """The trajectory with the host's answer to its last turn: the observation's tokens
        appended (none when the answer ends the episode) and the result recorded."""
        self._open()
        if record.turn != self.turn - 1:
            raise ValueError(f"sample {self.handle.sample_id}: the answer is to turn {record.turn}, "
                             f"the last model turn is {self.turn - 1}")
        n = len(ids)
        return dataclasses.replace(
            self, token_ids=self.token_ids + tuple(ids), model_mask=self.model_mask + (False,) * n,
            logprobs=self.logprobs + (0.0,) * n, versions=self.versions + (NOT_MODEL,) * n,
            tool_results=self.tool_results + (record,), done=record.result.done)

    def _open(self) -> None:
        if self.done:
            raise ValueError(f"sample {self.handle.sample_id}: the episode has ended")


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of one turn of an episode. An engine's draw for output token t
    depends on (seed, sample_id, t) and t restarts at 0 each turn, so each turn gets its own
    seed, derived from the sample's: the same on every engine, different for every turn.

    >>> turn_seed(1234, 0) == 1234, turn_seed(1234, 1) == turn_seed(1234, 1) != 1234
    (True, True)
    """
    if turn == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
