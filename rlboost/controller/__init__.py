"""The rollout controller: instance leases, token-level routing, adaptive offload, exactly-once collection.

Policy modules (registry, router, offload, collector, estimates) are pure and importable
without Ray; service.py drives engines through adapters; actor.py is the Ray actor.
"""
