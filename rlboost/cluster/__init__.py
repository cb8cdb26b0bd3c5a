"""The run's processes on Ray: placement (session), rollout instances as actors (instance),
the fleet that starts and preempts them (fleet), availability traces and their replay
(traces, replay), and the cost ledger (cost).
"""
