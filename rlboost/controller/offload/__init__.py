"""Adaptive rollout offload: how long the reserved cluster rolls out each step before it
trains. AdaptiveWindow (adaptive.py) sizes the local window from measured rates;
ReferenceWindowRule (reference.py) is the published baseline; both implement WindowPolicy
(window.py), which the controller's step decisions ask each tick.
"""

from __future__ import annotations

from rlboost.controller.offload.adaptive import AdaptiveWindow, AdaptiveWindowConfig
from rlboost.controller.offload.reference import ReferenceWindowConfig, ReferenceWindowRule
from rlboost.controller.offload.window import StepObservation, WindowContext, WindowPolicy, ideal_step_time

__all__ = ["POLICIES", "AdaptiveWindow", "AdaptiveWindowConfig", "ReferenceWindowConfig", "ReferenceWindowRule",
           "StepObservation", "WindowContext", "WindowPolicy", "ideal_step_time", "make_policy"]

POLICIES = ("adaptive", "reference")


def make_policy(name: str, config: AdaptiveWindowConfig | ReferenceWindowConfig | None = None) -> WindowPolicy:
    """A window policy by name: "adaptive" (default) or "reference" (the published baseline)."""
    if name == "adaptive":
        if config is not None and not isinstance(config, AdaptiveWindowConfig):
            raise ValueError(f"the adaptive policy takes an AdaptiveWindowConfig, got {type(config).__name__}")
        return AdaptiveWindow(config)
    if name == "reference":
        if config is not None and not isinstance(config, ReferenceWindowConfig):
            raise ValueError(f"the reference policy takes a ReferenceWindowConfig, got {type(config).__name__}")
        return ReferenceWindowRule(config)
    raise ValueError(f"policy must be one of {POLICIES}, got {name!r}")
