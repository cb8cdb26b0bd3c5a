"""The run's processes on Ray: placement (session), rollout instances as actors (instance),
the fleet that starts, preempts and ends them as the controller's events say (fleet),
where preemptible capacity comes from (capacity: a trace or the live cluster), notices
from clouds and shutdown hooks (notices), availability traces and their replay (traces,
replay), and the cost ledger (cost).
"""
