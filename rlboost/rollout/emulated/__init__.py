"""An engine that takes the time a named GPU would and emits hash tokens: the emulated
fidelity level, where everything but the model's arithmetic is real."""

from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.rollout.emulated.engine import EmulatedEngine

__all__ = ["EmulatedEngine", "EmulatedEngineConfig"]
