"""TaskFeed: a task's problems as prompt groups for each step, and rewards for the groups
that come back, so the trainer sees scored samples and the controller only token ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rlboost.controller.records import CompletedGroup, MicroBatch, PromptGroup
from rlboost.migration.state import SamplingParams
from rlboost.models import ModelConfig
from rlboost.models.tokenizers import load_tokenizer
from rlboost.tasks.arithmetic import ArithmeticTask
from rlboost.tasks.base import Problem, Task
from rlboost.tasks.config import TaskConfig
from rlboost.tasks.dataset import MathTask
from rlboost.tasks.math_answers import extract_answer
from rlboost.trainer.batch import ScoredSample
from rlboost.trainer.sft import encode_prompt

GROUPS_PER_STEP_LIMIT = 100_000  # group ids are step * this + index


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
    same prompts. A sample earns the task's reward only if it stopped on its own (a
    truncated answer earns 0). With extract_answer, the final answer found in the text
    (\\boxed{}, "the answer is", else the last number) is scored instead of the whole text.
    """

    def __init__(self, task: Task, tokenizer, *, groups_per_step: int, group_size: int,
                 params: SamplingParams, prompt_template: str = "{prompt}", chat_template: bool = False,
                 extract_answer: bool = False, seed: int = 0):
        if not 1 <= groups_per_step <= GROUPS_PER_STEP_LIMIT:
            raise ValueError(f"groups_per_step must be in [1, {GROUPS_PER_STEP_LIMIT}], got {groups_per_step}")
        if chat_template and not hasattr(tokenizer, "chat_prompt"):
            raise ValueError(f"chat_template needs a tokenizer with a chat template, not {type(tokenizer).__name__}")
        self.task, self.tokenizer = task, tokenizer
        self.groups_per_step, self.group_size = groups_per_step, group_size
        if "{prompt}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{prompt}}', got {prompt_template!r}")
        self.params, self.template = params, prompt_template
        self.chat_template, self.extract = chat_template, extract_answer
        self.seed = seed
        self._problems: dict[int, Problem] = {}

    def groups(self, step: int) -> list[PromptGroup]:
        """The step's prompt groups (and remember their problems for scoring)."""
        problems = self.task.problems(self.groups_per_step, seed=self._seed(step, 0))
        self._problems = {}
        out = []
        for i, problem in enumerate(problems):
            gid = step * GROUPS_PER_STEP_LIMIT + i
            self._problems[gid] = problem
            out.append(PromptGroup(group_id=gid, prompt_ids=tuple(self.prompt_ids(problem)),
                                   params=self.params, num_samples=self.group_size,
                                   seed=self._seed(step, i + 1)))
        return out

    def prompt_ids(self, problem: Problem) -> list[int]:
        text = self.template.replace("{prompt}", problem.prompt)
        if self.chat_template:
            return self.tokenizer.chat_prompt(text)
        return encode_prompt(self.tokenizer, text)  # BOS first, as in the warm-up

    def score(self, mb: MicroBatch) -> list[ScoredSample]:
        """Every sample of the micro-batch with its reward."""
        return [s for g in mb.groups for s in self.score_group(g)]

    def score_group(self, group: CompletedGroup) -> Sequence[ScoredSample]:
        problem = self._problems.get(group.group_id)
        if problem is None:
            raise ValueError(f"group {group.group_id} was not handed out by this feed for the current step")
        return [ScoredSample(sample_id=s.sample_id, group_id=group.group_id, prompt_ids=group.prompt_ids,
                             output_ids=s.output_ids, output_logprobs=s.output_logprobs,
                             reward=self.reward(problem, s.output_ids, s.finish_reason),
                             weight_version=s.weight_version, temperature=self.params.temperature)
                for s in group.samples]

    def reward(self, problem: Problem, output_ids: Sequence[int], finish_reason: str) -> float:
        if finish_reason != "stop":
            return 0.0
        text = self.tokenizer.decode(output_ids)
        if self.extract:
            text = extract_answer(text) or ""
        return float(self.task.reward(problem, text))

    def describe(self, sample: ScoredSample | None) -> dict:
        """A sample as text (prompt, completion, reward), for logs."""
        if sample is None:
            return {}
        return {"example_prompt": self.tokenizer.decode(sample.prompt_ids),
                "example_completion": self.tokenizer.decode(sample.output_ids),
                "example_reward": sample.reward}

    def _seed(self, step: int, index: int) -> int:
        return (self.seed * 1_000_003 + step * 7_919 + index * 104_729 + 1) % (1 << 63)


def task_feed(task: TaskConfig, checkpoint: Path) -> TaskFeed:
    """The task's prompts as token ids for the checkpoint's tokenizer, with its stop tokens."""
    tokenizer = load_tokenizer(checkpoint)
    stops = {tokenizer.eos_id, *ModelConfig.load(checkpoint).eos_token_ids}
    params = SamplingParams(temperature=task.temperature, top_p=task.top_p,
                            max_new_tokens=task.max_new_tokens, stop_token_ids=tuple(sorted(stops)))
    source = ArithmeticTask(task.arithmetic) if task.name == "arithmetic" else MathTask.from_file(task.math)
    return TaskFeed(source, tokenizer, groups_per_step=task.groups_per_step, group_size=task.group_size,
                    params=params, prompt_template=task.prompt_template, chat_template=task.chat_template,
                    extract_answer=task.answer == "extract", seed=task.seed)
