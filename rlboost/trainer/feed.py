"""TaskFeed: a task's problems as prompt groups for each step, and rewards for the groups
that come back, so the trainer sees scored samples and the controller only token ids. The
rewards come from a RewardSource (the task's own check or the user's function), a micro-batch
at a time.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Protocol, Sequence

from rlboost.controller.records import CompletedGroup, MicroBatch, PromptGroup
from rlboost.controller.staleness import MAX_STALENESS
from rlboost.migration.state import SamplingParams
from rlboost.models.hf import eos_token_ids, read_hf_config
from rlboost.models.tokenizers import load_tokenizer
from rlboost.tasks.base import Problem, Task
from rlboost.tasks.config import TaskConfig
from rlboost.tasks.factory import build_rewards, build_task, reward_label
from rlboost.tasks.reward import RewardRequest, RewardSource, TaskReward
from rlboost.tasks.reward.ledger import RewardLedger
from rlboost.trainer.batch import ScoredSample
from rlboost.trainer.sft import encode_prompt

GROUPS_PER_STEP_LIMIT = 100_000  # group ids are step * this + index


class Episodes(Protocol):
    """Where a multi-turn run's episodes open (the environment host, through the run's cluster)."""

    def open_episodes(self, groups: Sequence[tuple[Sequence[int], Problem]]) -> list[str]:
        """Open every sample's episode of each (sample ids, problem); each group's first prompt."""

    def environment_executions(self) -> int:
        """Environment steps the host has executed so far (each call once)."""


class TaskFeed:
    """Prompt groups of a task, step by step, and the reward of each finished sample.

    >>> from rlboost.models import ByteTokenizer
    >>> from rlboost.tasks.arithmetic import ArithmeticTask
    >>> feed = TaskFeed(ArithmeticTask(), ByteTokenizer(), groups_per_step=2, group_size=4,
    ...                 params=SamplingParams(max_new_tokens=4, stop_token_ids=(258,)))
    >>> [g.group_id for g in feed.groups(3)]
    [300000, 300001]

    prompt_template wraps each problem's prompt ("{prompt}" is replaced by it).
    Problems are drawn deterministically from (seed, step), so a resumed run sees the
    same prompts. rewards scores the samples (default: the task's own reward, TaskReward: a
    sample earns it only if it stopped on its own, and with extract_answer the final answer
    found in the text is scored instead of the whole text); what failed and the named parts
    of the rewards are counted per step (step_metrics).
    """

    def __init__(self, task: Task, tokenizer, *, groups_per_step: int, group_size: int,
                 params: SamplingParams, prompt_template: str = "{prompt}", chat_template: bool = False,
                 extract_answer: bool = False, seed: int = 0, rewards: RewardSource | None = None,
                 reward_label: str = "the task's reward"):
        if not 1 <= groups_per_step <= GROUPS_PER_STEP_LIMIT:
            raise ValueError(f"groups_per_step must be in [1, {GROUPS_PER_STEP_LIMIT}], got {groups_per_step}")
        if chat_template and not hasattr(tokenizer, "chat_prompt"):
            raise ValueError(f"chat_template needs a tokenizer with a chat template, not {type(tokenizer).__name__}")
        self.task, self.tokenizer = task, tokenizer
        self.groups_per_step, self.group_size = groups_per_step, group_size
        if "{prompt}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{prompt}}', got {prompt_template!r}")
        self.params, self.template = params, prompt_template
        self.chat_template = chat_template
        self.seed = seed
        self.rewards = rewards or TaskReward(task, extract=extract_answer)
        self.ledger = RewardLedger(reward_label)
        self._problems: dict[int, Problem] = {}
        self._episodes: Counter[str] = Counter()  # multi-turn episodes scored this step
        self.episodes: Episodes | None = None  # multi-turn: where each sample's episode opens

    def stop_also_at(self, token_ids: Sequence[int]) -> None:
        """Turns also end at these tokens (a tool call's closing tag)."""
        stops = tuple(sorted({*self.params.stop_token_ids, *map(int, token_ids)}))
        self.params = dataclasses.replace(self.params, stop_token_ids=stops)

    def problem(self, group_id: int) -> Problem:
        """The problem of one of the current step's groups."""
        return self._problems[group_id]

    def groups(self, step: int) -> list[PromptGroup]:
        """The step's prompt groups (and remember their problems for scoring, with those of
        the steps around it: with bounded staleness later steps' groups are drawn while
        earlier ones are still scored)."""
        problems = self.task.problems(self.groups_per_step, seed=self._seed(step, 0))
        self._problems = {g: p for g, p in self._problems.items()
                          if abs(g // GROUPS_PER_STEP_LIMIT - step) <= MAX_STALENESS}
        out = []
        for i, problem in enumerate(problems):
            gid = step * GROUPS_PER_STEP_LIMIT + i
            self._problems[gid] = problem
            out.append(PromptGroup(group_id=gid, prompt_ids=tuple(self.prompt_ids(problem)),
                                   params=self.params, num_samples=self.group_size,
                                   seed=self._seed(step, i + 1)))
        if self.episodes is not None:  # every sample's episode opens; its environment words the prompt
            texts = self.episodes.open_episodes([(g.sample_ids, self._problems[g.group_id]) for g in out])
            out = [dataclasses.replace(g, prompt_ids=tuple(prompt_token_ids(
                self.tokenizer, self.template, self.chat_template, text))) for g, text in zip(out, texts)]
        return out

    def prompt_ids(self, problem: Problem) -> list[int]:
        return prompt_token_ids(self.tokenizer, self.template, self.chat_template, problem.prompt)

    def score(self, mb: MicroBatch) -> list[ScoredSample]:
        """Every sample of the micro-batch with its reward (all scored in one call to the
        reward source); RewardsFailed when this is the step's last micro-batch and every
        reward of the step failed."""
        scored = self._score_groups(mb.groups)
        if mb.last:
            self.ledger.check_step(mb.step)
        return scored

    def score_group(self, group: CompletedGroup) -> Sequence[ScoredSample]:
        return self._score_groups([group])

    def _score_groups(self, groups: Sequence[CompletedGroup]) -> list[ScoredSample]:
        problems = {g.group_id: self._problem(g) for g in groups}
        pairs = [(g, s) for g in groups for s in g.samples]
        # an episode's answer is its last model turn; the turns and observations before it are the work
        requests = [self._request(problems[g.group_id], s.output_ids[s.answer_start:], s.finish_reason, g.group_id,
                                  s.sample_id, s.weight_version) for g, s in pairs]
        results = self.rewards.score(requests)
        self.ledger.add(results)
        self._count_episodes([s for _, s in pairs])
        return [ScoredSample(sample_id=s.sample_id, group_id=g.group_id, prompt_ids=g.prompt_ids,
                             output_ids=s.output_ids, output_logprobs=s.output_logprobs,
                             reward=r.score if s.environment_reward is None else s.environment_reward,
                             weight_version=s.weight_version, temperature=self.params.temperature,
                             version_changes=s.version_changes, model_mask=s.model_mask)
                for (g, s), r in zip(pairs, results)]

    def _count_episodes(self, samples: Sequence) -> None:
        for s in samples:
            if s.turns:
                self._episodes["episodes"] += 1
                self._episodes["turns"] += s.turns
                self._episodes["episodes_calling_tool"] += s.turns > 1
                self._episodes["observation_tokens"] += len(s.output_ids) - (sum(s.model_mask) if s.model_mask
                                                                            else len(s.output_ids))

    def _problem(self, group: CompletedGroup) -> Problem:
        problem = self._problems.get(group.group_id)
        if problem is None:
            raise ValueError(f"group {group.group_id} was not handed out by this feed for the current step")
        return problem

    def _request(self, problem: Problem, output_ids: Sequence[int], finish_reason: str, group_id: int = -1,
                 sample_id: int = -1, weight_version: int = -1) -> RewardRequest:
        metadata = {"sample_id": sample_id, "group_id": group_id, "problem_id": problem.problem_id,
                    "step": group_id // GROUPS_PER_STEP_LIMIT if group_id >= 0 else -1,
                    "weight_version": weight_version, "finish_reason": finish_reason,
                    "output_tokens": len(output_ids), "answer": problem.answer}
        return RewardRequest(problem=problem, completion=self.tokenizer.decode(output_ids), metadata=metadata)

    def reward(self, problem: Problem, output_ids: Sequence[int], finish_reason: str) -> float:
        """One sample's reward (finish_reason: "stop" or "length")."""
        return self.rewards.score([self._request(problem, output_ids, finish_reason)])[0].score

    def step_metrics(self, step: int) -> dict:
        """The step's reward failures by kind and the mean of each named part (then zeroed),
        the prompts the task dropped for length and the records of its data set refused at
        load, by cause; RewardsFailed when every reward of the step failed (and score()
        could not tell: its last micro-batch came empty)."""
        self.ledger.check_step(step)
        refused = getattr(self.task, "refused", None)  # a data set's; generated problems have none
        return {**self.ledger.take(), "prompts_dropped": getattr(self.task, "dropped", 0),
                **({"records_refused": refused} if refused is not None else {}), **self._take_episodes(),
                **({"environment_executions": self.episodes.environment_executions()} if self.episodes else {})}

    def _take_episodes(self) -> dict:
        """Multi-turn steps: the share of episodes that called the tool, turns per episode and
        observation tokens (then zeroed)."""
        e, self._episodes = self._episodes, Counter()
        if not e["episodes"]:
            return {}
        return {"episodes": e["episodes"], "tool_call_fraction": e["episodes_calling_tool"] / e["episodes"],
                "turns_mean": e["turns"] / e["episodes"], "observation_tokens": e["observation_tokens"]}

    def close(self) -> None:
        self.rewards.close()

    def describe(self, sample: ScoredSample | None) -> dict:
        """A sample as text (prompt, completion, reward), for logs."""
        if sample is None:
            return {}
        return {"example_prompt": self.tokenizer.decode(sample.prompt_ids),
                "example_completion": self.tokenizer.decode(sample.output_ids),
                "example_reward": sample.reward}

    def _seed(self, step: int, index: int) -> int:
        return (self.seed * 1_000_003 + step * 7_919 + index * 104_729 + 1) % (1 << 63)


def prompt_token_ids(tokenizer, template: str, chat_template: bool, prompt: str) -> list[int]:
    """A problem's prompt as the model sees it: wrapped in the template, then in the chat
    template, or with BOS first (as in the warm-up)."""
    text = template.replace("{prompt}", prompt)
    if chat_template:
        return tokenizer.chat_prompt(text)
    return encode_prompt(tokenizer, text)


def task_feed(task: TaskConfig, checkpoint: Path) -> TaskFeed:
    """The task's prompts as token ids for the checkpoint's tokenizer, with its stop tokens,
    and its reward source (ValueError when task.reward does not resolve)."""
    tokenizer = load_tokenizer(checkpoint)
    stops = {tokenizer.eos_id, *eos_token_ids(read_hf_config(checkpoint))}
    params = SamplingParams(temperature=task.temperature, top_p=task.top_p,
                            max_new_tokens=task.max_new_tokens, stop_token_ids=tuple(sorted(stops)))
    source = build_task(task, lambda prompt: len(prompt_token_ids(tokenizer, task.prompt_template,
                                                                  task.chat_template, prompt)))
    return TaskFeed(source, tokenizer, groups_per_step=task.groups_per_step, group_size=task.group_size,
                    params=params, prompt_template=task.prompt_template, chat_template=task.chat_template,
                    seed=task.seed, rewards=build_rewards(task, source), reward_label=reward_label(task))
