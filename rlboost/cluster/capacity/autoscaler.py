"""Asking Ray's autoscaler for the run's preemptible capacity: one request for max_preemptible
instance bundles, kept while the run runs and withdrawn when it ends, fails, is stopped or
restarts. On a cluster without an autoscaler the request is stored and nothing happens.

The request is the cluster's one standing request (`ray.autoscaler.sdk.request_resources`):
another driver's request replaces it, and a driver killed outright cannot withdraw it (the
autoscaler then keeps the nodes until a later request or the cluster's own limits).
"""

from __future__ import annotations

import logging

from ray.autoscaler.sdk import request_resources

log = logging.getLogger(__name__)


class ResourceRequest:
    """keep() asks for count bundles; withdraw() asks for none (idempotent, never raises)."""

    def __init__(self, bundle: dict[str, float], count: int):
        self.bundle, self.count = dict(bundle), int(count)
        self.kept = False

    def keep(self) -> None:
        request_resources(bundles=[dict(self.bundle) for _ in range(self.count)])
        self.kept = True

    def withdraw(self) -> None:
        if not self.kept:
            return
        try:
            request_resources(bundles=[])
            self.kept = False
        except Exception:  # Ray is going away: the request goes with the cluster's session
            log.exception("withdrawing the autoscaler request failed")

    def describe(self) -> dict:
        return {"bundle": self.bundle, "count": self.count}
