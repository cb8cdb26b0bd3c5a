"""The one place an EnvironmentConfig becomes environments: a built-in one by name, or the
user's class its name points to (package.module:Class or path/to/file.py:Class, resolved as
task.reward's function is), made fresh for each episode with the config's options.
"""

from __future__ import annotations

import functools
import inspect
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

from rlboost.environments.calculator import CalculatorEnvironment
from rlboost.environments.config import EnvironmentConfig
from rlboost.environments.sandbox.environment import PythonSandboxEnvironment
from rlboost.environments.sandbox.runner import run_python
from rlboost.environments.tool_calls import ToolCallFormat
from rlboost.tasks.reward.plugin import RewardTarget, load_attribute


@dataclass(frozen=True, slots=True)
class EnvironmentKind:
    """How to make one episode's environment (make()), its name for messages and metrics, and
    the tool-call tags its turns end with (None: none)."""

    make: Callable[[], Any]
    label: str
    tool_call: ToolCallFormat | None


def environment_kind(config: EnvironmentConfig) -> EnvironmentKind:
    """The environments config.name names. A user's class that cannot be found, is not a class
    with reset and step, or cannot take config.options is a ValueError in one line; so is a
    sandbox that cannot confine code here (SandboxUnavailable) when it must."""
    if not config.name:
        raise ValueError("environment.name is empty: a single-turn run has no environments")
    if config.name == "calculator":
        c = config.calculator
        return EnvironmentKind(functools.partial(CalculatorEnvironment, c), "calculator",
                               ToolCallFormat(open=c.open, close=c.close))
    if config.name == "sandbox":
        s = config.sandbox
        with tempfile.TemporaryDirectory(prefix="rlboost-sandbox-check-") as folder:
            run_python("pass", folder, s)  # SandboxUnavailable now, not at the first episode
        return EnvironmentKind(functools.partial(PythonSandboxEnvironment, s), "sandbox",
                               ToolCallFormat(open=s.open, close=s.close))
    return _user_kind(config)


def _user_kind(config: EnvironmentConfig) -> EnvironmentKind:
    target = RewardTarget.parse(config.name, field="environment.name", noun="Class")
    cls = load_attribute(target)
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not inspect.isclass(cls) or missing:
        what = f"lacks {' and '.join(missing)}" if inspect.isclass(cls) else f"is a {type(cls).__name__}"
        raise ValueError(f"environment.name: {target.label} {what}; it must be a class with reset(problem) and "
                         "step(turn) (rlboost.environments.Environment)")
    try:
        inspect.signature(cls).bind(**config.options)
    except TypeError as e:
        raise ValueError(f"environment.options: {target.label} cannot be made with {sorted(config.options)} "
                         f"({e})") from None
    except ValueError:
        pass  # a class without a signature to read: its first episode will tell
    tool_call = getattr(cls, "tool_call", None)
    if tool_call is not None and not isinstance(tool_call, ToolCallFormat):
        raise ValueError(f"environment.name: {target.label}.tool_call must be None or a ToolCallFormat, "
                         f"got {type(tool_call).__name__}")
    return EnvironmentKind(functools.partial(cls, **config.options), target.label, tool_call)
