"""EnvironmentConfig: which environment a multi-turn run's episodes play (a built-in one or a
user's class), how long an episode may go, and how the host that runs them bounds each step.
It holds the built-in environments' own configs whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlboost.environments.calculator import CalculatorConfig
from rlboost.environments.sandbox.config import SandboxConfig
from rlboost.validate import require

BUILT_IN = ("calculator", "sandbox")


@dataclass(kw_only=True, slots=True)
class EnvironmentConfig:
    """The environment of each episode and the host's bounds.

    name: "" (single-turn: no environment), a built-in one (calculator, sandbox), or a
    user's class, package.module:Class or path/to/file.py:Class, made once per episode with
    options as keywords.

    >>> EnvironmentConfig(name="calculator").max_turns
    4
    """

    name: str = ""
    """"" (none), calculator, sandbox, or a class: package.module:Class or path/to/file.py:Class"""
    options: dict[str, Any] = field(default_factory=dict)
    """keywords a user's class is made with (JSON values)"""
    max_turns: int = 4
    """model turns per episode; the episode ends after the last one whatever the environment says"""
    step_timeout_s: float = 30.0
    """an environment's reset or step that takes longer ends its episode as a failure ("timeout")"""
    workers: int = 8
    """steps the host runs at once (threads)"""
    max_environments: int = 4096
    """live episodes the host holds at most (each until the driver closes it)"""
    observation_role: str = "tool"
    """the chat role observations take (chat models only); "user" works with every template"""
    calculator: CalculatorConfig = field(default_factory=CalculatorConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        require(self.name in ("", *BUILT_IN) or ":" in self.name, "environment.name",
                f"'', one of {BUILT_IN}, or 'package.module:Class' / 'path/to/file.py:Class'", self.name)
        require(isinstance(self.options, dict) and all(isinstance(k, str) for k in self.options),
                "environment.options", "a dict with string keys", self.options)
        require(1 <= self.max_turns <= 1024, "environment.max_turns", "in [1, 1024]", self.max_turns)
        require(0 < self.step_timeout_s <= 86_400, "environment.step_timeout_s", "in (0, 86400]",
                self.step_timeout_s)
        require(1 <= self.workers <= 1024, "environment.workers", "in [1, 1024]", self.workers)
        require(1 <= self.max_environments <= 10_000_000, "environment.max_environments", "in [1, 1e7]",
                self.max_environments)
        require(bool(self.observation_role) and self.observation_role.isidentifier(),
                "environment.observation_role", "a role name such as 'tool' or 'user'", self.observation_role)

    @property
    def multi_turn(self) -> bool:
        return bool(self.name)
