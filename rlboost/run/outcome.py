"""How a training run ends, in words a user can act on: which failures of a started run are
expected (a step that cannot complete, a process of the run that died), which of them the
driver recovers from by restarting at the last checkpoint, and the one or two lines
`rlboost train` prints for each way a run ends, with its exit code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlboost.errors import RlboostError, RunFailed, RunHalted, RunInterrupted, StepFailed
from rlboost.run.directory import RunDirectory

EXIT_OK = 0
EXIT_BUG = 1            # an unexpected exception: Python prints its traceback
EXIT_BAD_INPUT = 2      # the run cannot start as configured (config, files, checkpoints, cluster)
EXIT_RUN_FAILED = 3     # a started run stopped on a failure
EXIT_INTERRUPTED = 130  # stopped by the user (Ctrl-C), as shells report SIGINT

_MAX_CHARS = 400
_OWN_PROCESSES = {"RolloutController": "the controller", "TrainerRank": "a trainer rank"}


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a train() call ended: its run directory, the last step trained and checkpointed,
    and whether the user stopped it (Ctrl-C) before its last step."""

    run: RunDirectory
    last_step: int
    stopped: bool


class RecoverableFailure(RunFailed):
    """A launch of the run stopped on a failure the driver recovers from by restarting the
    run at its last checkpoint: a process of the run (the controller, a trainer rank) died,
    or a step failed. The message says what, in which step."""


class RestartsExhausted(RunFailed):
    """A recoverable failure came once more than run.max_restarts allows: the run stops,
    and `rlboost train` says so in one line."""

    def __init__(self, failure: RecoverableFailure, restarts: int, max_restarts: int):
        super().__init__(str(failure), step=failure.step, run_dir=failure.run_dir,
                         resume_from=failure.resume_from)
        self.restarts, self.max_restarts = restarts, max_restarts


def recoverable(exc: BaseException, died: list[str], step: int) -> str | None:
    """What stopped a launch, as a headline naming the step ("trainer rank 1 died in step
    4", "step 4 failed: StepFailed: ..."), when the driver may restart the run for it;
    None otherwise. died: the run's own processes found dead after exc (a dead trainer
    rank often shows first as a collective that failed on a live one)."""
    import ray.exceptions as rex

    if not died and isinstance(exc, rex.RayActorError):  # found dead before its handle could be asked
        match = re.search(r"class_name:\s*(\w+)", str(exc))
        died = [_OWN_PROCESSES[match.group(1)]] if match and match.group(1) in _OWN_PROCESSES else []
    if died:
        return f"{' and '.join(died)} died in step {step}"
    if isinstance(_unwrap(exc), StepFailed):
        return f"step {step} failed: {failure_summary(exc)}"
    return None


def _unwrap(exc: BaseException) -> BaseException:
    import ray.exceptions as rex

    while isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, BaseException):
        exc = exc.cause
    return exc


def failure_summary(exc: BaseException) -> str | None:
    """One line describing an expected failure of a started run, or None when `exc` is a
    bug (which deserves its traceback)."""
    import ray.exceptions as rex  # the run has started Ray already

    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        return failure_summary(cause) if cause is not None and isinstance(cause, RlboostError) else None
    if isinstance(exc, RlboostError):
        return _clip(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, rex.RayActorError):
        match = re.search(r"class_name:\s*(\w+)", str(exc))
        who = match.group(1) if match else "an actor"
        return _clip(f"a process of the run died ({who}): {_first_line(exc)}")
    if isinstance(exc, (rex.NodeDiedError, rex.ObjectLostError, rex.WorkerCrashedError, rex.LocalRayletDiedError,
                        rex.OutOfMemoryError)):
        return _clip(f"{type(exc).__name__}: {_first_line(exc)}")
    if isinstance(exc, rex.GetTimeoutError):
        return _clip(f"a process of the run did not answer in time: {_first_line(exc)}")
    return None


def halted(kind: type[RunHalted], message: str, run: RunDirectory, step: int,
           resume_from: int | None) -> RunHalted:
    return kind(message, step=step, run_dir=str(run.path), resume_from=resume_from)


def restart_line(failure: RecoverableFailure, restart: int, max_restarts: int) -> str:
    """What the driver prints when it restarts the run after a recoverable failure."""
    where = (f"continuing from the checkpoint of step {failure.resume_from}" if failure.resume_from is not None
             else "continuing from step 1 (no checkpoint yet)")
    return f"restart {restart}/{max_restarts}: {failure}; {where}"


def ending_lines(exc: RunHalted) -> list[str]:
    """What `rlboost train` prints when a started run ends early (at most two lines; one
    when its restarts are used up)."""
    if isinstance(exc, RestartsExhausted):
        tries = f"after {exc.restarts} restart{'s' if exc.restarts > 1 else ''}" if exc.restarts else "no restart"
        return [f"rlboost train: {exc} ({tries}, run.max_restarts={exc.max_restarts}); "
                f"{resume_hint(exc.run_dir, exc.resume_from)}"]
    if isinstance(exc, RunInterrupted):
        first = f"rlboost train: interrupted in step {exc.step}"
    else:
        first = f"rlboost train: step {exc.step} failed: {exc}"
    return [first, resume_hint(exc.run_dir, exc.resume_from)]


def stopped_lines(result: RunResult) -> list[str]:
    """What `rlboost train` prints when the user stopped a run after a checkpoint."""
    return [f"rlboost train: stopped at step {result.last_step} (checkpoint written); continue with: "
            f"rlboost train --resume {result.run.path}"]


def resume_hint(run_dir: str, resume_from: int | None) -> str:
    """The command that continues the run; without a checkpoint, what its folder keeps."""
    if resume_from is not None:
        return f"continue from the checkpoint of step {resume_from} with: rlboost train --resume {run_dir}"
    if run_dir and RunDirectory.has_metrics(run_dir):
        return (f"no checkpoint was written, so it cannot be resumed: {run_dir} keeps the metrics, plots and summary "
                "of the steps it finished; start the run again with the same command")
    return "no checkpoint was written; start the run again with the same command"


def exit_code(exc: RunHalted) -> int:
    return EXIT_INTERRUPTED if isinstance(exc, RunInterrupted) else EXIT_RUN_FAILED


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_CHARS else text[:_MAX_CHARS - 3] + "..."

