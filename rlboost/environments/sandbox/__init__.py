"""The bounded Python sandbox: the model's code runs in a child process confined by the
kernel (resource limits, a network namespace, Landlock, seccomp) to a temporary folder of
its episode, within a wall-clock time."""

from rlboost.environments.sandbox.config import SandboxConfig
from rlboost.environments.sandbox.environment import PythonSandboxEnvironment
from rlboost.environments.sandbox.runner import SandboxRun, run_python

__all__ = ["PythonSandboxEnvironment", "SandboxConfig", "SandboxRun", "run_python"]
