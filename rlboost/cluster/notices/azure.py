"""Azure preemption notices from Scheduled Events (metadata/scheduledevents, header
`Metadata: true`): a Preempt event for this VM with NotBefore, at least 30 seconds ahead.
The VM's own name (metadata/instance/compute/name) picks its events out of those of its
scale set."""

from __future__ import annotations

import logging
from email.utils import parsedate_to_datetime

from rlboost.cluster.notices.base import Notice, NoticeConfig, PollingNotices, http, json_or_none, seconds_until

EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}
log = logging.getLogger(__name__)


class AzureNotices(PollingNotices):
    name, cloud = "azure", "Azure"

    def __init__(self, config: NoticeConfig):
        super().__init__(config, config.azure_url)
        self._vm: str | None = None

    @classmethod
    def probe(cls, config: NoticeConfig) -> bool:
        try:
            status, body, _ = http("GET", config.azure_url.rstrip("/") + NAME_PATH, HEADERS, config.probe_timeout_s)
        except OSError:
            return False
        return status == 200 and bool(body.strip())

    def _ask(self) -> Notice | None:
        if self._vm is None:
            status, body, _ = http("GET", self.base + NAME_PATH, HEADERS, self.config.poll_s + 5)
            self._vm = body.strip() if status == 200 else ""
        status, body, _ = http("GET", self.base + EVENTS_PATH, HEADERS, self.config.poll_s + 5)
        document = json_or_none(body) if status == 200 else None
        if document is None:
            log.warning("Azure scheduledevents answered %d %r; ignored", status, body[:200])
            return None
        for event in document.get("Events") or ():
            if not isinstance(event, dict) or event.get("EventType") != "Preempt":
                continue
            resources = event.get("Resources") or []
            if self._vm and resources and self._vm not in resources:
                continue  # another VM of the scale set
            return Notice(source="azure", grace_s=self._grace(event.get("NotBefore")),
                          detail=str(event.get("EventId", "")))
        return None

    def _grace(self, not_before: object) -> float:
        if not not_before:
            return self.config.azure_grace_s
        try:
            when = parsedate_to_datetime(str(not_before))
        except (TypeError, ValueError):
            return self.config.azure_grace_s
        return seconds_until(when)
