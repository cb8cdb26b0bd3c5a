"""AWS spot interruption notices from the instance metadata service (IMDSv2): a session token
(PUT latest/api/token), then latest/meta-data/spot/instance-action, which answers 404 until
the instance is to be reclaimed and then {"action": "terminate", "time": "...Z"}, about two
minutes ahead."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from rlboost.cluster.notices.base import Notice, NoticeConfig, PollingNotices, http, json_or_none, seconds_until

TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_S = 21600
log = logging.getLogger(__name__)


class AwsNotices(PollingNotices):
    name, cloud = "aws", "AWS"

    def __init__(self, config: NoticeConfig):
        super().__init__(config, config.aws_url)
        self._token: str | None = None
        self._token_at = 0.0

    @classmethod
    def probe(cls, config: NoticeConfig) -> bool:
        try:
            status, body, _ = http("PUT", config.aws_url.rstrip("/") + TOKEN_PATH,
                                   {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, config.probe_timeout_s)
        except OSError:
            return False
        return status == 200 and bool(body.strip())

    def _ask(self) -> Notice | None:
        status, body, _ = http("GET", self.base + ACTION_PATH, {"X-aws-ec2-metadata-token": self._session()},
                               self.config.poll_s + 5.0)
        if status == 401:  # the token expired: a new one next time
            self._token = None
            return None
        if status == 404:
            return None
        action = json_or_none(body) if status == 200 else None
        if action is None or "time" not in action:
            log.warning("AWS instance-action answered %d %r; ignored", status, body[:200])
            return None
        grace = seconds_until(datetime.fromisoformat(str(action["time"]).replace("Z", "+00:00")))
        return Notice(source="aws", grace_s=grace, detail=str(action.get("action", "")))

    def _session(self) -> str:
        if self._token is None or time.monotonic() - self._token_at > TOKEN_TTL_S / 2:
            status, body, _ = http("PUT", self.base + TOKEN_PATH,
                                   {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)}, self.config.poll_s + 5)
            if status != 200 or not body.strip():
                raise OSError(f"IMDSv2 token request answered {status}")
            self._token, self._token_at = body.strip(), time.monotonic()
        return self._token
