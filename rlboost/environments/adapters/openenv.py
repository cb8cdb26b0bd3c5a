"""OpenEnv environments (the `openenv-core` package: a Gymnasium-like server interface,
Environment.reset() / step(action) -> Observation with done and reward) as rlboost
environments, run in the host's process with no HTTP server between.

    environment.name = "rlboost.environments.adapters.openenv:OpenEnvEnvironment"
    environment.options = {"environment": "package.module:TheirEnvironment",
                           "action": "package.module:TheirAction",
                           "options": {...their constructor's keywords...}}

The model's turn becomes the action's text field (the one required text field of the action
model, or options' text_field); the observation's text is its own text fields (besides done,
reward and metadata) as they are when it has one, else "name: value" lines, or the fields
options' observation_fields lists. The episode's seed is the problem's id, for environments
whose reset takes one; the task's prompt is not shown to them (they pose their own).
"""

from __future__ import annotations

import inspect
from typing import Any

from rlboost.environments.base import ModelTurn, StepResult
from rlboost.tasks.base import Problem
from rlboost.tasks.reward.plugin import RewardTarget, load_attribute

BASE_FIELDS = ("done", "reward", "metadata")


class OpenEnvEnvironment:
    """One episode of an OpenEnv environment (see the module docstring). Turns end only at
    the end of the model's answer: the environment answers every one."""

    tool_call = None

    def __init__(self, *, environment: str, action: str, options: dict | None = None, text_field: str = "",
                 observation_fields: list[str] | None = None):
        env_class = _load(environment, "environment.options.environment")
        self.action_class = _load(action, "environment.options.action")
        self.text_field = text_field or _text_field(self.action_class)
        self.observation_fields = list(observation_fields or [])
        self.env = env_class(**(options or {}))

    def reset(self, problem: Problem) -> str:
        accepted = inspect.signature(self.env.reset).parameters
        kwargs = {k: v for k, v in (("seed", problem.problem_id), ("episode_id", str(problem.problem_id)))
                  if k in accepted or any(p.kind is p.VAR_KEYWORD for p in accepted.values())}
        return self._text(self.env.reset(**kwargs))

    def step(self, turn: ModelTurn) -> StepResult:
        observation = self.env.step(self.action_class(**{self.text_field: turn.text}))
        reward = observation.reward
        return StepResult(observation="" if observation.done else self._text(observation), done=bool(observation.done),
                          reward=None if reward is None else float(reward))

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def _text(self, observation: Any) -> str:
        values = observation.model_dump()
        names = self.observation_fields or [n for n, v in values.items() if n not in BASE_FIELDS and isinstance(v, str)]
        shown = [(n, values.get(n)) for n in names if values.get(n) not in (None, "")]
        if len(shown) == 1 and not self.observation_fields:
            return str(shown[0][1])
        return "\n".join(f"{name}: {value}" for name, value in shown)


def _load(spec: str, field: str) -> Any:
    return load_attribute(RewardTarget.parse(spec, field=field, noun="Class"))


def _text_field(action_class: Any) -> str:
    """The action model's one required text field (the model's words go there)."""
    fields = getattr(action_class, "model_fields", {})
    text = [n for n, f in fields.items() if f.is_required() and f.annotation is str]
    if len(text) != 1:
        raise ValueError(f"environment.options.text_field: {action_class.__name__} has {len(text)} required text "
                         f"fields {text}; name the one the model's turn goes to")
    return text[0]
