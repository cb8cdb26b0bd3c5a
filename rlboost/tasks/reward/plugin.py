"""A user's reward function named in the config: `package.module:function` (a module on
sys.path or in the current directory) or `path/to/file.py:function`. Loaded once at start,
where a name that does not resolve or a signature that cannot take the arguments is one
line (ValueError), and again in each reward worker process. Other plug-ins named the same
way (an environment's class) resolve through RewardTarget.parse(spec, field=...) and
load_attribute, with their own field's name in every message.

A plain function is called as fn(prompt=..., completion=..., row=..., metadata=...); a
batched one as fn(prompts=[...], completions=[...], rows=[...], metadata=[...]) and returns
a list. Either may be `async def` (or return an awaitable).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PLAIN_ARGS = ("prompt", "completion", "row", "metadata")
BATCHED_ARGS = ("prompts", "completions", "rows", "metadata")


@dataclass(frozen=True, slots=True)
class RewardTarget:
    """Where a reward function (or another plug-in) lives, resolved so another process finds
    it: a module name (with the directory it was resolved from) or an absolute file path, and
    the function's (or class's) name. field is the config field that named it, for messages.

    >>> RewardTarget.parse("my_rewards:score", cwd="/work").module
    'my_rewards'
    """

    module: str | None
    path: str | None
    function: str
    cwd: str
    batched: bool = False
    field: str = "task.reward"

    @classmethod
    def parse(cls, spec: str, *, cwd: str | None = None, batched: bool = False,
              field: str = "task.reward", noun: str = "function") -> RewardTarget:
        """noun: what the name after the colon is, in the message for a spec without one."""
        cwd = cwd or os.getcwd()
        where, sep, function = spec.strip().rpartition(":")
        if not sep or not where or not function.isidentifier():
            raise ValueError(f"{field} must be 'package.module:{noun}' or 'path/to/file.py:{noun}', got {spec!r}")
        if where.endswith(".py") or "/" in where or os.sep in where:
            path = Path(where).expanduser()
            path = path if path.is_absolute() else Path(cwd) / path
            return cls(module=None, path=str(path.resolve()), function=function, cwd=cwd, batched=batched,
                       field=field)
        if not all(part.isidentifier() for part in where.split(".")):
            raise ValueError(f"{field}: {where!r} is neither a module name nor a .py file path")
        return cls(module=where, path=None, function=function, cwd=cwd, batched=batched, field=field)

    @property
    def label(self) -> str:
        return f"{self.module or self.path}:{self.function}"


_loaded: dict[RewardTarget, Callable[..., Any]] = {}


def load_function(target: RewardTarget) -> Callable[..., Any]:
    """The function, imported once per process; ValueError in one line when it cannot be
    found, fails to import, or cannot take the arguments it will be called with."""
    fn = _loaded.get(target)
    if fn is None:
        fn = load_attribute(target)
        if not callable(fn):
            raise ValueError(f"{target.field}: {target.label} is {type(fn).__name__}, not a function")
        _check_signature(fn, target)
        _loaded[target] = fn
    return fn


def load_attribute(target: RewardTarget) -> Any:
    """What the target names in its module (imported once per process); ValueError in one
    line, naming target.field, when the module cannot be found or imported or lacks the name."""
    module = _import(target)
    value = getattr(module, target.function, None)
    if value is None:
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"{target.field}: {module.__name__} has no {target.function!r} (it has {names[:10]})")
    return value


def _import(target: RewardTarget):
    try:
        if target.path is not None:
            return _import_file(Path(target.path), target.field)
        try:
            return importlib.import_module(target.module)
        except ModuleNotFoundError as e:
            if e.name is None or not target.module.startswith(e.name) or target.cwd in sys.path:
                raise
            sys.path.append(target.cwd)  # a module of the directory the run started in
            return importlib.import_module(target.module)
    except ValueError:
        raise
    except Exception as e:  # the user's module failed to import: say where, in one line
        raise ValueError(f"{target.field}: importing {target.module or target.path} failed: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None


def _import_file(path: Path, field: str):
    if not path.is_file():
        raise ValueError(f"{field}: {path} does not exist")
    name = "rlboost_reward_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{field}: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _check_signature(fn: Callable[..., Any], target: RewardTarget) -> None:
    names = BATCHED_ARGS if target.batched else PLAIN_ARGS
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function without a signature: its first call will tell
    try:
        signature.bind(**{n: None for n in names})
    except TypeError as e:
        kind = "a batched reward (task.reward_batch_size > 0)" if target.batched else "a reward"
        raise ValueError(f"task.reward: {target.label}{signature} cannot be called as {kind} with keywords "
                         f"{', '.join(names)} ({e}); accept them, or **kwargs") from None
