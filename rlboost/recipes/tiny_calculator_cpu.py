"""tiny_calculator_cpu: multi-turn episodes with a tool on a CPU. The tiny model of tiny_cpu
answers three-operand problems of one-digit numbers ("8*7+3=") with a calculator at hand: a
turn that ends with a call ("[8*7+3]") is answered by the calculator on the environment host,
off the preemptible instances, and the model reads the result before it answers. Its warm-up
shows the tool on half of the problems; the model then gets few of them right on its own and
most through the tool, so GRPO, which rewards whichever way gets the answer right, teaches it
to call the tool (in 30 steps the share of episodes calling it went from 0.48 to 1.0). The
same fleet and trace as tiny_cpu: three preemptions (notice, sudden, notice) meet episodes
mid-turn and between turns.
"""

from __future__ import annotations

import dataclasses

from rlboost.config.run import RunConfig, RunOptions
from rlboost.environments.config import EnvironmentConfig
from rlboost.recipes.tiny_cpu import tiny_cpu
from rlboost.tasks.arithmetic import ArithmeticConfig


def tiny_calculator_cpu() -> RunConfig:
    base = tiny_cpu()
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, warmup_steps=300),
        task=dataclasses.replace(base.task, arithmetic=ArithmeticConfig(max_operand=9, num_operands=3, operators="+*",
                                                                         tool_demos=0.5),
                                 groups_per_step=32, group_size=8, max_new_tokens=16),
        environment=EnvironmentConfig(name="calculator", max_turns=3, workers=4),
        run=RunOptions(name="tiny_calculator_cpu", steps=30, checkpoint_every=10),
    )
