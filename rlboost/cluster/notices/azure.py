"""Azure preemption notices from Scheduled Events (metadata/scheduledevents, header
`Metadata: true`): a Preempt event for this VM with NotBefore, at least 30 seconds ahead.
The VM's own name (metadata/instance/compute/name) picks its events out of those of its
scale set. No scheduled event gives more than 15 minutes of notice: a NotBefore further
off is read as 15 minutes."""

from __future__ import annotations

import logging
from email.utils import parsedate_to_datetime

from rlboost.cluster.notices.base import (
    BadAnswer,
    Notice,
    NoticeConfig,
    PollingNotices,
    answers,
    field,
    grace_until,
    http,
    json_or_none,
)

EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}
AZURE_NOTICE_S = 900.0  # the longest notice Scheduled Events gives (Preempt: at least 30 s)
log = logging.getLogger(__name__)


class AzureNotices(PollingNotices):
    name, cloud = "azure", "Azure"

    def __init__(self, config: NoticeConfig):
        super().__init__(config, config.azure_url)
        self._vm: str | None = None

    @classmethod
    def probe(cls, config: NoticeConfig) -> bool:
        answer = answers("GET", config.azure_url.rstrip("/") + NAME_PATH, HEADERS, config.probe_timeout_s)
        return answer is not None and answer[0] == 200 and bool(answer[1].strip())

    def _ask(self, timeout_s: float) -> Notice | None:
        if self._vm is None:
            status, body, _ = http("GET", self.base + NAME_PATH, HEADERS, timeout_s)
            self._vm = body.strip()[:256] if status == 200 else ""
        status, body, _ = http("GET", self.base + EVENTS_PATH, HEADERS, timeout_s)
        document = json_or_none(body) if status == 200 else None
        if document is None:
            raise BadAnswer(f"scheduledevents answered {status}: {body[:120]!r}")
        for event in field(document, "Events", list, "scheduledevents answered 200"):
            if not isinstance(event, dict) or event.get("EventType") != "Preempt":
                continue
            resources = field(event, "Resources", list, "a Preempt event") if "Resources" in event else []
            if self._vm and resources and self._vm not in resources:
                continue  # another VM of the scale set
            return Notice(source="azure", grace_s=self._grace(event.get("NotBefore")),
                          detail=str(event.get("EventId", ""))[:60])
        return None

    def _grace(self, not_before: object) -> float:
        if not not_before or not isinstance(not_before, str):
            return self.config.azure_grace_s
        try:
            when = parsedate_to_datetime(not_before)
        except (TypeError, ValueError, OverflowError):
            return self.config.azure_grace_s
        return grace_until(when, AZURE_NOTICE_S)
