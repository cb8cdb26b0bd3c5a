"""The simulator: a discrete-event simulation of whole runs (Simulator, from a SimSpec) that
runs the controller's own round (controller.round.StepRound) over simulated engines with the
emulated engines' timing core (sim.mover), and the emulated fleet and trainer around a real
RolloutService on virtual time (EmulatedFleet).

It sits beside cluster/ and reuses the controller's policy code unchanged, so what is
simulated is the policy that runs. Nothing in controller/ or rollout/ imports it.
"""

from rlboost.sim.fleet import EVENT_KINDS, EmulatedFleet, FleetEvent, SimInstance
from rlboost.sim.metrics import SimSummary, summarize
from rlboost.sim.simulator import SimResult, Simulator
from rlboost.sim.spec import SimSpec
from rlboost.sim.trainer import EmulatedTrainerConfig, run_emulated_steps
from rlboost.sim.workload import make_groups

__all__ = ["EVENT_KINDS", "EmulatedFleet", "EmulatedTrainerConfig", "FleetEvent", "SimInstance", "SimResult",
           "SimSpec", "SimSummary", "Simulator", "make_groups", "run_emulated_steps", "summarize"]
