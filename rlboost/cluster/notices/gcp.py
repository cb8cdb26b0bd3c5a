"""GCP preemption notices from the metadata server: instance/preempted (header
`Metadata-Flavor: Google`) turns TRUE about 30 seconds before a spot or preemptible VM is
stopped; with ?wait_for_change=true the server answers only when the value changes."""

from __future__ import annotations

import logging
from urllib.parse import quote

from rlboost.cluster.notices.base import MetadataWatcher, Notice, NoticeConfig, answers, http

PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
PROBE_PATH = "/computeMetadata/v1/instance/id"
HEADERS = {"Metadata-Flavor": "Google"}
MAX_ETAG = 256
log = logging.getLogger(__name__)


class GcpNotices(MetadataWatcher):
    """Not polled: each next() is one long request that the server answers on a change."""

    name, cloud = "gcp", "GCP"

    def __init__(self, config: NoticeConfig):
        super().__init__(config, config.gcp_url)
        self._etag: str | None = None  # the value last seen: wait for a change from it

    @classmethod
    def probe(cls, config: NoticeConfig) -> bool:
        answer = answers("GET", config.gcp_url.rstrip("/") + PROBE_PATH, HEADERS, config.probe_timeout_s)
        # the metadata server names itself in its answers; anything else at the address is not it
        return answer is not None and answer[0] == 200 and answer[2].get("Metadata-Flavor") == "Google"

    def next(self, timeout_s: float) -> Notice | None:
        if self._stop.is_set():
            return None
        wait = max(1, int(timeout_s))
        # the ETag is the server's text: escaped, so no answer can change the next request's URL
        query = "" if self._etag is None else \
            f"?wait_for_change=true&timeout_sec={wait}&last_etag={quote(self._etag, safe='')}"
        try:
            status, body, headers = http("GET", self.base + PREEMPTED_PATH + query, HEADERS, wait + 5.0)
        except Exception as exc:  # no answer in time, or not HTTP
            self.trouble(f"unreachable {type(exc).__name__}", "GCP metadata at %s did not answer: %r", self.base, exc)
            self._stop.wait(min(timeout_s, self.config.poll_s))
            return None
        if status != 200:
            self.trouble(f"status {status}", "GCP instance/preempted answered %d %r; ignored", status, body[:200])
            self._stop.wait(min(timeout_s, self.config.poll_s))
            return None
        etag = headers.get("ETag")
        self._etag = (etag[:MAX_ETAG] if isinstance(etag, str) and etag else None) or self._etag or "NONE"
        if body.strip().upper() == "TRUE":
            return Notice(source="gcp", grace_s=self.config.gcp_grace_s, detail="preempted")
        return None
