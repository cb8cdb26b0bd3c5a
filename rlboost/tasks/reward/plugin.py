"""A user's reward function named in the config: `package.module:function` (a module on
sys.path or in the current directory) or `path/to/file.py:function`. Loaded once at start,
where a name that does not resolve or a signature that cannot take the arguments is one
line (ValueError), and again in each reward worker process.

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
    """Where a reward function lives, resolved so another process finds it: a module name
    (with the directory it was resolved from) or an absolute file path, and the function.

    >>> RewardTarget.parse("my_rewards:score", cwd="/work").module
    'my_rewards'
    """

    module: str | None
    path: str | None
    function: str
    cwd: str
    batched: bool = False

    @classmethod
    def parse(cls, spec: str, *, cwd: str | None = None, batched: bool = False) -> RewardTarget:
        cwd = cwd or os.getcwd()
        where, sep, function = spec.strip().rpartition(":")
        if not sep or not where or not function.isidentifier():
            raise ValueError(f"task.reward must be 'package.module:function' or 'path/to/file.py:function', "
                             f"got {spec!r}")
        if where.endswith(".py") or "/" in where or os.sep in where:
            path = Path(where).expanduser()
            path = path if path.is_absolute() else Path(cwd) / path
            return cls(module=None, path=str(path.resolve()), function=function, cwd=cwd, batched=batched)
        if not all(part.isidentifier() for part in where.split(".")):
            raise ValueError(f"task.reward: {where!r} is neither a module name nor a .py file path")
        return cls(module=where, path=None, function=function, cwd=cwd, batched=batched)

    @property
    def label(self) -> str:
        return f"{self.module or self.path}:{self.function}"


_loaded: dict[RewardTarget, Callable[..., Any]] = {}


def load_function(target: RewardTarget) -> Callable[..., Any]:
    """The function, imported once per process; ValueError in one line when it cannot be
    found, fails to import, or cannot take the arguments it will be called with."""
    fn = _loaded.get(target)
    if fn is None:
        module = _import(target)
        fn = getattr(module, target.function, None)
        if fn is None:
            names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise ValueError(f"task.reward: {module.__name__} has no {target.function!r} (it has {names[:10]})")
        if not callable(fn):
            raise ValueError(f"task.reward: {target.label} is {type(fn).__name__}, not a function")
        _check_signature(fn, target)
        _loaded[target] = fn
    return fn


def _import(target: RewardTarget):
    try:
        if target.path is not None:
            return _import_file(Path(target.path))
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
        raise ValueError(f"task.reward: importing {target.module or target.path} failed: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None


def _import_file(path: Path):
    if not path.is_file():
        raise ValueError(f"task.reward: {path} does not exist")
    name = "rlboost_reward_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"task.reward: {path} is not a Python file")
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
