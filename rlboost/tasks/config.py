"""TaskConfig: what a run's prompts are, how many samples each, and how they are scored; it
holds the task sources' own configs whole (arithmetic, math dataset, any dataset), and names
the reward function when it is the user's."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.tasks.arithmetic import ArithmeticConfig
from rlboost.tasks.column_dataset import ColumnDatasetConfig
from rlboost.tasks.dataset import MathDatasetConfig
from rlboost.validate import require

TASKS = ("arithmetic", "math", "dataset")
ANSWER_MODES = ("whole", "extract")


@dataclass(kw_only=True, slots=True)
class TaskConfig:
    """Prompts, how many samples each, and how they are scored.

    chat_template wraps each prompt in the tokenizer's chat template (HF tokenizers only).
    answer "whole" scores the whole completion; "extract" scores the final answer found in
    it (the last \\boxed{}, "the answer is x", else the last number), for chatty models.
    reward names a function of the user's that scores instead of the task's own check
    (docs/own-task.md); it runs in reward_workers processes, reward_timeout_s per call.

    >>> TaskConfig(name="math", math=MathDatasetConfig(path="gsm8k.parquet")).math.answer_format
    'auto'
    """

    name: str = "arithmetic"
    """the task: arithmetic (generated sums), math (a math file) or dataset (any table, by column)"""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    math: MathDatasetConfig = field(default_factory=MathDatasetConfig)
    dataset: ColumnDatasetConfig = field(default_factory=ColumnDatasetConfig)
    reward: str = ""
    """a reward function, package.module:function or path/to/file.py:function ("": the task's own)"""
    reward_timeout_s: float = 60.0
    """a reward call that takes longer scores 0 (its worker is replaced)"""
    reward_workers: int = 2
    """processes that run the reward function, in parallel"""
    reward_batch_size: int = 0
    """0: the function scores one sample per call; N: it takes lists of up to N samples"""
    prompt_template: str = "{prompt}"
    """wraps each problem; {prompt} is replaced by it"""
    chat_template: bool = False
    """wrap each prompt in the tokenizer's chat template"""
    answer: str = "whole"
    """what is scored: the whole completion, or the final answer extracted from it"""
    groups_per_step: int = 64
    """prompts per step (each one a group of samples)"""
    group_size: int = 8
    """samples per prompt (GRPO's group)"""
    max_new_tokens: int = 4
    """longest completion; a sample cut off here earns no reward"""
    temperature: float = 1.0
    """sampling temperature (> 0: GRPO needs varied groups)"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    seed: int = 0
    """seeds which problems each step draws"""

    def __post_init__(self) -> None:
        require(self.name in TASKS, "name", f"one of {TASKS}", self.name)
        if self.name == "math":
            require(bool(self.math.path), "math.path", "a dataset file when name is 'math'", self.math.path)
        if self.name == "dataset":
            require(bool(self.dataset.path), "task.dataset.path", "a dataset when name is 'dataset'",
                    self.dataset.path)
            require(self.dataset.answer_key is not None or bool(self.reward), "task.dataset.answer_key",
                    "a column name unless task.reward names a function (nothing else can score)",
                    self.dataset.answer_key)
        require(self.reward == "" or ":" in self.reward, "task.reward",
                "'package.module:function' or 'path/to/file.py:function'", self.reward)
        require(self.reward_timeout_s > 0, "task.reward_timeout_s", "> 0", self.reward_timeout_s)
        require(1 <= self.reward_workers <= 1024, "task.reward_workers", "in [1, 1024]", self.reward_workers)
        require(0 <= self.reward_batch_size <= 1_000_000, "task.reward_batch_size", "in [0, 1e6]",
                self.reward_batch_size)
        require("{prompt}" in self.prompt_template, "prompt_template", "a string containing '{prompt}'",
                self.prompt_template)
        require(self.answer in ANSWER_MODES, "answer", f"one of {ANSWER_MODES}", self.answer)
        require(1 <= self.groups_per_step <= 100_000, "groups_per_step", "in [1, 100000]", self.groups_per_step)
        require(2 <= self.group_size < 65536, "group_size", "in [2, 65535]", self.group_size)
        require(self.max_new_tokens >= 1, "max_new_tokens", ">= 1", self.max_new_tokens)
        require(self.temperature > 0.0, "temperature", "> 0 (GRPO needs sampled groups)", self.temperature)
        require(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p)
