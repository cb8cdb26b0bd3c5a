"""SandboxConfig: the bounds of each piece of code the Python sandbox runs, and the tags a
model turn wraps the code in."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.validate import require


@dataclass(kw_only=True, slots=True)
class SandboxConfig:
    """Bounds of one run of the model's code, and its tags.

    >>> SandboxConfig().memory_mb
    256
    """

    open: str = "```python"
    """tag that opens the code"""
    close: str = "```"
    """tag that ends the code and the model's turn (one token of the model's tokenizer)"""
    time_s: float = 5.0
    """wall-clock time a run may take (CPU time is bounded to the next second above it too)"""
    memory_mb: int = 256
    """address space of the run's process"""
    file_mb: int = 16
    """largest file the run may write (its folder is its only writable place)"""
    max_output_bytes: int = 4096
    """stdout and stderr the model reads back, each cut to this"""
    require_isolation: bool = True
    """refuse to run code unless the network namespace, Landlock and seccomp all apply"""

    def __post_init__(self) -> None:
        require(bool(self.open) and bool(self.close), "environment.sandbox.open/close", "non-empty tags",
                (self.open, self.close))
        require(0 < self.time_s <= 3600, "environment.sandbox.time_s", "in (0, 3600]", self.time_s)
        require(32 <= self.memory_mb <= 1 << 20, "environment.sandbox.memory_mb", "in [32, 1048576]",
                self.memory_mb)
        require(1 <= self.file_mb <= 1 << 20, "environment.sandbox.file_mb", "in [1, 1048576]", self.file_mb)
        require(1 <= self.max_output_bytes <= 1 << 24, "environment.sandbox.max_output_bytes", "in [1, 16 MiB]",
                self.max_output_bytes)
