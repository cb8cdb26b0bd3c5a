"""rlboost's own rollout engine: a paged-KV torch decoder with batch-invariant kernels, so
a migrated sample continues exactly as it would have on its first engine. The engine (and
torch) loads on first use: its config is read by processes that never run it."""

from typing import TYPE_CHECKING

from rlboost.rollout.embedded.config import EmbeddedEngineConfig

if TYPE_CHECKING:
    from rlboost.rollout.embedded.engine import EmbeddedEngine

__all__ = ["EmbeddedEngine", "EmbeddedEngineConfig"]


def __getattr__(name: str):
    if name == "EmbeddedEngine":
        from rlboost.rollout.embedded.engine import EmbeddedEngine

        return EmbeddedEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
