"""rlboost's own rollout engine: a paged-KV torch decoder with batch-invariant kernels, so
a migrated sample continues exactly as it would have on its first engine."""

from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.rollout.embedded.engine import EmbeddedEngine

__all__ = ["EmbeddedEngine", "EmbeddedEngineConfig"]
