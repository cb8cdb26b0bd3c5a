"""The rollout controller: instance lifecycle and leases, token-level routing, adaptive
offload, exactly-once collection.

Policy modules (registry, router, offload, collector, estimates) are pure and importable
without Ray. The registry owns each instance's lifecycle and emits its events (events.py),
which the driver follows. service.py is a short loop over parts with public interfaces:
engines.py (the engine table), intake.py and mover.py (samples' tokens in, samples moved),
decisions.py (what to do each tick), lifecycle.py (the trainer's calls); adapters.py is
its one face of an engine, in process or over Ray. actor.py is the Ray actor.
"""
