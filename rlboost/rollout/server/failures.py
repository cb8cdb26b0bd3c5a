"""An engine's failure in its own words, as one line: the typed errors (rlboost.errors) an
adapter raises when its engine does not start or fails to load a weight version, with the
engine's message as the cause (not a wrapper's "see the log above"), so a run can print it."""

from __future__ import annotations

from rlboost.errors import EngineFailed, EngineStartFailed, WeightLoadFailed

_MAX_CAUSE = 400


def points_elsewhere(message: str) -> bool:
    """Whether a message only points to a log for its cause, as engines word a failure that
    happened in another of their processes ("... See root cause above")."""
    lowered = message.lower()
    return "root cause" in lowered or "see stack trace" in lowered or "check the stack trace" in lowered


def describe(e: BaseException) -> str:
    """The most telling one-line account of e: its type and first line, following chained
    causes past wrappers whose message only points elsewhere.

    >>> describe(RuntimeError("Engine core initialization failed. See root cause above."))
    'RuntimeError: Engine core initialization failed. See root cause above.'
    """
    chain = _chain(e)
    for link in chain:
        line = _first_line(link)
        if line and not points_elsewhere(line):
            return _clip(f"{type(link).__name__}: {line}")
    return _clip(f"{type(chain[0]).__name__}: {_first_line(chain[0])}")


def start_failure(engine: str, e: BaseException, cause: str = "") -> EngineStartFailed:
    """The error for an engine that did not start; cause: the engine's own account (default:
    describe(e))."""
    if isinstance(e, EngineStartFailed):
        return e
    cause = cause or describe(e)
    return EngineStartFailed(f"{engine} did not start: {cause}", engine=engine, cause=cause)


def load_failure(engine: str, version: int, e: BaseException, cause: str = "") -> WeightLoadFailed:
    """The error for a weight version the engine failed to load (cause as for start_failure)."""
    if isinstance(e, WeightLoadFailed):
        return e
    cause = cause or describe(e)
    return WeightLoadFailed(f"{engine} failed to load weight version {version}: {cause}", engine=engine, cause=cause)


def run_failure(engine: str, e: BaseException, cause: str = "") -> EngineFailed:
    """The error for an engine that failed while running (its process died, a stream broke)."""
    if isinstance(e, EngineFailed):
        return e
    cause = cause or describe(e)
    return EngineFailed(f"{engine} failed: {cause}", engine=engine, cause=cause)


def again(failure: EngineFailed) -> EngineFailed:
    """A fresh copy of a failure, to raise on a later call (one exception object raised from
    several threads would share its traceback)."""
    return type(failure)(str(failure), failure.engine, failure.cause)


def _chain(e: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_CAUSE else text[:_MAX_CAUSE - 3] + "..."
