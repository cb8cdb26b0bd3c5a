"""PythonSandboxEnvironment: math answers with a Python tool. A model turn that ends with code
("```python ... ```") is answered with what the code printed, run in the sandbox in a folder
of the episode's own (files it writes stay for its later calls); a turn without code ends
the episode and is the answer the task's reward scores."""

from __future__ import annotations

import shutil
import tempfile

from rlboost.environments.base import ModelTurn, StepResult
from rlboost.environments.sandbox.config import SandboxConfig
from rlboost.environments.sandbox.runner import MEMORY, TIME, SandboxRun, run_python
from rlboost.environments.tool_calls import ToolCallFormat
from rlboost.tasks.base import Problem


class PythonSandboxEnvironment:
    """One episode with a Python sandbox. `calls` counts the runs this episode made; close()
    removes the episode's folder."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self.tool_call = ToolCallFormat(open=self.config.open, close=self.config.close)
        self.folder: str | None = None
        self.calls = 0

    def reset(self, problem: Problem) -> str:
        self.close()
        self.folder = tempfile.mkdtemp(prefix="rlboost-sandbox-")
        return problem.prompt

    def step(self, turn: ModelTurn) -> StepResult:
        code = self.tool_call.find_call(turn.text) if turn.finish_reason == "stop" else None
        if code is None:
            return StepResult(done=True)
        if self.folder is None:
            raise RuntimeError("step before reset")
        self.calls += 1
        return StepResult(observation=self.observation(run_python(code, self.folder, self.config)), done=False)

    def observation(self, run: SandboxRun) -> str:
        """What the model reads back: the output, then the error's last line or the limit hit."""
        text = run.stdout
        if run.limit == TIME:
            text += f"\nerror: the code ran past its time limit ({self.config.time_s:g} s)"
        elif run.limit == MEMORY:
            text += f"\nerror: the code ran out of memory ({self.config.memory_mb} MB)"
        elif run.exit_code != 0:
            last = [line for line in run.stderr.splitlines() if line.strip()][-1:] or [f"exit code {run.exit_code}"]
            text += f"\nerror: {last[0]}"
        return text.strip("\n")

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
