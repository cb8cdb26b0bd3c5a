"""The rollout controller: instance leases, token-level routing, adaptive offload, exactly-once collection.

Policy modules (registry, router, offload, collector, estimates) are pure and importable
without Ray. service.py is a short loop over parts with public interfaces: engines.py (the
engine table), intake.py and mover.py (samples' tokens in, samples moved), decisions.py
(what to do each tick), lifecycle.py (the trainer's calls). actor.py is the Ray actor.
"""
