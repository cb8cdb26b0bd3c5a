"""EpisodeHost: the environment host as the episode driver speaks to it, in token ids. The
driver (beside the rollout controller, which holds no tokenizer) hands it a model turn's
tokens; the host decodes them, has the sample's environment answer once (EnvironmentHost:
by sample, turn and call id) and returns the observation as the next turn's prompt tokens.

Usage (through a Ray actor handle, rlboost.cluster.environment_host, or in process):
    text = await host.open(sample_ids, problem)        # every sample's episode starts
    answer = await host.answer(sample_id, turn, token_ids, "stop")   # TurnAnswer
    await host.close(sample_id)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rlboost.environments.base import ENVIRONMENT_RECORD_FORMAT_VERSION, ModelTurn
from rlboost.environments.config import EnvironmentConfig
from rlboost.environments.host import EnvironmentHost
from rlboost.environments.observations import ChatObservations, PlainObservations
from rlboost.environments.records import ToolCall, call_id
from rlboost.errors import EpisodeError
from rlboost.models.tokenizers import load_tokenizer
from rlboost.tasks.base import Problem
from rlboost.validate import check_format_version


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnAnswer:
    """The environment's answer to one model turn, as tokens: observation_ids are the next
    turn's prompt tokens (empty when done); reward the environment's, when it gives one;
    failure the kind of fault that ended the episode (None: none); replayed: the answer
    came from the host's record, not from an execution.

    >>> TurnAnswer(sample_id=7, turn=0, observation_ids=(56,), done=False, replayed=False).done
    False
    """

    sample_id: int
    turn: int
    observation_ids: tuple[int, ...]
    done: bool
    replayed: bool
    reward: float | None = None
    failure: str | None = None
    format_version: int = ENVIRONMENT_RECORD_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, ENVIRONMENT_RECORD_FORMAT_VERSION)
        if not self.done and not self.observation_ids:
            raise ValueError(f"sample {self.sample_id}: an answer that does not end the episode needs observation "
                             "tokens")


class EpisodeHost(EnvironmentHost):
    """An EnvironmentHost that speaks token ids (see the module docstring). tokenizer_dir: the
    checkpoint folder whose tokenizer the model uses; chat: observations go in its chat
    template's markup (else as plain text after the model's turn)."""

    def __init__(self, config: EnvironmentConfig, *, tokenizer_dir: str, chat: bool = False,
                 name: str = "rlboost-environments"):
        super().__init__(config, name=name)
        self.tokenizer = load_tokenizer(Path(tokenizer_dir))
        self.text = (ChatObservations(self.tokenizer, role=config.observation_role) if chat
                     else PlainObservations(self.tokenizer))

    async def open(self, sample_ids: Sequence[int], problem: Problem) -> str:
        """Start the episode of every sample of one prompt group; returns their first prompt's
        text (EpisodeError when the environment opens them differently: a group shares its
        prompt). A failed reset opens with the problem's prompt; its first answer ends it."""
        texts = set()
        for sid in sample_ids:
            opening = await self.reset(int(sid), problem)
            texts.add(problem.prompt if opening.failed else opening.text)
        if len(texts) != 1:
            raise EpisodeError(f"the environment opened the episodes of problem {problem.problem_id} with "
                               f"{len(texts)} different prompts; the samples of one group must share their prompt")
        return texts.pop()

    async def open_groups(self, groups: Sequence[tuple[Sequence[int], Problem]]) -> list[str]:
        """open() for each (sample ids, problem) of a step, in one call."""
        return [await self.open(sids, problem) for sids, problem in groups]

    async def answer(self, sample_id: int, turn: int, token_ids: Sequence[int], finish_reason: str) -> TurnAnswer:
        """The environment's answer to the sample's model turn, executed at most once."""
        ids = tuple(int(t) for t in token_ids)
        episode = self._episode(sample_id)
        if episode.opening is not None and episode.opening.failed:
            return TurnAnswer(sample_id=sample_id, turn=turn, observation_ids=(), done=True, replayed=True,
                              failure=episode.opening.failure)
        model_turn = ModelTurn(text=self.tokenizer.decode(ids), token_ids=ids, finish_reason=finish_reason)
        reply = await self.step(ToolCall(sample_id=sample_id, turn=turn, call_id=call_id(sample_id, turn),
                                         model_turn=model_turn))
        result = reply.record.result
        observation = () if result.done else tuple(self.text.observation(result.observation, turn_ids=ids))
        if not result.done and not observation:
            raise EpisodeError(f"sample {sample_id}: the environment's observation after turn {turn} is empty; "
                               "an episode that goes on needs text for the model to read")
        return TurnAnswer(sample_id=sample_id, turn=turn, observation_ids=observation, done=result.done,
                          replayed=reply.replayed, reward=result.reward, failure=result.failure)
