"""AWS spot interruption notices from the instance metadata service (IMDSv2): a session token
(PUT latest/api/token), then latest/meta-data/spot/instance-action, which answers 404 until
the instance is to be reclaimed and then {"action": "terminate", "time": "...Z"}, about two
minutes ahead (AWS documents a two-minute warning: a later time is read as two minutes)."""

from __future__ import annotations

import logging
import time
from datetime import datetime

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

AWS_NOTICE_S = 120.0  # "a two-minute warning" (EC2 Spot instance interruption notices)
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
        answer = answers("PUT", config.aws_url.rstrip("/") + TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                         config.probe_timeout_s)
        return answer is not None and answer[0] == 200 and bool(answer[1].strip())

    def _ask(self, timeout_s: float) -> Notice | None:
        status, body, _ = http("GET", self.base + ACTION_PATH, {"X-aws-ec2-metadata-token": self._session(timeout_s)},
                               timeout_s)
        if status == 401:  # the token expired: a new one next time
            self._token = None
            return None
        if status == 404:
            return None
        action = json_or_none(body) if status == 200 else None
        if action is None:
            raise BadAnswer(f"instance-action answered {status}: {body[:120]!r}")
        when = field(action, "time", str, "instance-action answered 200")
        try:
            deadline = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            raise BadAnswer(f"instance-action answered 200: time {when[:60]!r} is no ISO 8601 time") from None
        return Notice(source="aws", grace_s=grace_until(deadline, AWS_NOTICE_S), detail=str(action.get("action", ""))[:60])

    def _session(self, timeout_s: float) -> str:
        if self._token is None or time.monotonic() - self._token_at > TOKEN_TTL_S / 2:
            status, body, _ = http("PUT", self.base + TOKEN_PATH,
                                   {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)}, timeout_s)
            if status != 200 or not body.strip():
                raise OSError(f"IMDSv2 token request answered {status}")
            self._token, self._token_at = body.strip(), time.monotonic()
        return self._token
