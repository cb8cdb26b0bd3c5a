"""The simulator: an emulated fleet and trainer around the real controller, on its clock.

It sits beside cluster/ and reuses the controller's policy code unchanged, so what is
simulated is the policy that runs. Nothing in controller/ or rollout/ imports it.
"""

from rlboost.sim.fleet import EVENT_KINDS, EmulatedFleet, FleetEvent, SimInstance
from rlboost.sim.trainer import EmulatedTrainerConfig, run_emulated_steps
from rlboost.sim.workload import make_groups

__all__ = ["EVENT_KINDS", "EmulatedFleet", "EmulatedTrainerConfig", "FleetEvent", "SimInstance", "make_groups",
           "run_emulated_steps"]
