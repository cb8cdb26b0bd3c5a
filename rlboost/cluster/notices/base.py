"""Preemption notices as one record from any source: a cloud's metadata service (AWS, GCP,
Azure) or a node's shutdown hook (`rlboost notice`). One small interface, one class per
source beside it (aws.py, gcp.py, azure.py), chosen by name (factory.build_watcher); `auto`
probes each cloud's endpoint once, with a short timeout.

Stdlib only: a notice watcher runs in a light actor on every preemptible node, and
`rlboost notice` must start in well under a second.
"""

from __future__ import annotations

import abc
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from rlboost.cluster.notices.http import request
from rlboost.validate import check_format_version, require

NOTICE_FORMAT_VERSION = 1
CLOUDS = ("aws", "gcp", "azure")
NOTICE_SOURCES = ("auto", *CLOUDS, "none")
# A node's Ray label that overrides cluster.notice_source for that node (a cluster that spans
# clouds, or on-premises nodes beside spot ones): `ray start --labels='{"rlboost.io/notice-source": "gcp"}'`.
SOURCE_LABEL = "rlboost.io/notice-source"
SOCKET_NAME_BYTES = 21  # "/" + 16 hex digits of the node id + ".sock"
MIN_REQUEST_S = 1.0  # the least time a request to a metadata service is given, whatever is left of a watch
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice:
    """This node goes away in grace_s seconds (as read on the node when the notice came).

    >>> Notice(source="aws", grace_s=118.5, detail="terminate").grace_s
    118.5

    source: aws, gcp, azure (the cloud's metadata service) or hook (`rlboost notice`).
    A duration, not a time, crosses machines, so the nodes' clocks need not agree.
    """

    source: str
    grace_s: float
    detail: str = ""
    format_version: int = NOTICE_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, NOTICE_FORMAT_VERSION)
        require(self.source in (*CLOUDS, "hook"), "Notice.source", f"one of {(*CLOUDS, 'hook')}", self.source)
        require(self.grace_s >= 0, "Notice.grace_s", ">= 0", self.grace_s)


@dataclass(kw_only=True, slots=True)
class NoticeConfig:
    """Where each node's notice watcher asks, and how often.

    The base URLs are the clouds' own metadata addresses; point them elsewhere for a proxy
    or a test server (tests use 127.0.0.1 only).
    """

    aws_url: str = "http://169.254.169.254"
    """AWS instance metadata (IMDSv2) base URL"""
    gcp_url: str = "http://metadata.google.internal"
    """GCP metadata server base URL"""
    azure_url: str = "http://169.254.169.254"
    """Azure instance metadata (Scheduled Events) base URL"""
    probe_timeout_s: float = 0.5
    """how long `auto` waits for each metadata endpoint's answer"""
    poll_s: float = 2.0
    """seconds between two questions to AWS or Azure (GCP's server answers when the value changes)"""
    gcp_grace_s: float = 30.0
    """warning a GCP preemption gives (GCP's notice carries no time), seconds"""
    azure_grace_s: float = 30.0
    """warning an Azure Preempt event without NotBefore gives, seconds"""
    hook: bool = True
    """each node listens for `rlboost notice` from its shutdown hook"""
    hook_dir: str | None = None
    """folder of the nodes' notice sockets (None: rlboost-notices-UID in the temporary folder)"""

    def __post_init__(self) -> None:
        for name in ("aws_url", "gcp_url", "azure_url"):
            url = getattr(self, name)
            require(isinstance(url, str) and url.startswith(("http://", "https://")), f"cluster.notices.{name}",
                    "an http:// or https:// URL", url)
        require(0 < self.probe_timeout_s <= 30, "cluster.notices.probe_timeout_s", "in (0, 30]", self.probe_timeout_s)
        require(0 < self.poll_s <= 60, "cluster.notices.poll_s", "in (0, 60]", self.poll_s)
        for name in ("gcp_grace_s", "azure_grace_s"):
            require(0 <= getattr(self, name) <= 3600, f"cluster.notices.{name}", "in [0, 3600]", getattr(self, name))
        require(self.hook_dir is None or bool(self.hook_dir), "cluster.notices.hook_dir", "None or a folder",
                self.hook_dir)
        require(self.hook_dir is None or len(os.fsencode(os.path.abspath(self.hook_dir))) + SOCKET_NAME_BYTES <= 107,
                "cluster.notices.hook_dir", f"a folder whose path leaves room for a Unix socket's name (at most "
                f"{107 - SOCKET_NAME_BYTES} bytes)", self.hook_dir)


class NoticeWatcher(Protocol):
    """One source of a node's preemption notices."""

    name: str

    def next(self, timeout_s: float) -> Notice | None:
        """Wait up to about timeout_s for a notice; None when none came meanwhile. A source that
        fails to answer is retried at the next call (logged), never fatal."""

    def close(self) -> None:
        """Stop waiting (a call in progress returns within its timeout)."""


class NoNotices:
    """`none`: the node's cloud gives no notice (only its shutdown hook can)."""

    name = "none"

    def __init__(self, config: NoticeConfig | None = None):
        self._stop = threading.Event()

    @classmethod
    def probe(cls, config: NoticeConfig) -> bool:
        return True

    def next(self, timeout_s: float) -> Notice | None:
        self._stop.wait(timeout_s)
        return None

    def close(self) -> None:
        self._stop.set()


def http(method: str, url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, str, dict]:
    """(status, body, headers) of one request that ends within timeout_s as a whole (see
    notices/http.py); OSError when the server cannot be reached or does not answer in time."""
    return request(method, url, headers, timeout_s)


def answers(method: str, url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, str, dict] | None:
    """http(), or None when nothing answers there in time (a probe's question: is this cloud's
    metadata server here at all?)."""
    try:
        return http(method, url, headers, timeout_s)
    except OSError:
        return None


def json_or_none(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def seconds_until(when: datetime) -> float:
    """Seconds from now to `when` (naive times are UTC), never below 0."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def grace_until(when: datetime, longest_s: float) -> float:
    """Seconds until `when`, at most longest_s (the cloud's documented notice length): a time
    far off (year 9999) is an odd answer, not a licence to wait past the cloud's deadline."""
    try:
        return min(seconds_until(when), longest_s)
    except OverflowError:  # out of datetime's range once made UTC
        return longest_s


class BadAnswer(ValueError):
    """A metadata service answered something that is not what its documentation says."""


def field(document: Any, name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """document[name] when it is of `kind`; BadAnswer naming `what` otherwise."""
    value = document.get(name) if isinstance(document, dict) else None
    if not isinstance(value, kind):
        raise BadAnswer(f"{what}: {name} is {type(value).__name__} {str(value)[:60]!r}")
    return value


class MetadataWatcher:
    """What every cloud's watcher shares: its service's address, a stop event that close()
    sets, and trouble logged once per kind. Subclasses give next(timeout_s)."""

    name = "metadata"
    cloud = "the"

    def __init__(self, config: NoticeConfig, base_url: str):
        self.config = config
        self.base = base_url.rstrip("/")
        self._stop = threading.Event()
        self._said: set[str] = set()

    def trouble(self, kind: str, message: str, *args: object) -> None:
        """Log a kind of trouble with the service once (later ones at debug level)."""
        level = logging.DEBUG if kind in self._said else logging.WARNING
        self._said.add(kind)
        log.log(level, message, *args)

    def close(self) -> None:
        self._stop.set()


class PollingNotices(MetadataWatcher, abc.ABC):
    """A watcher that asks its service every config.poll_s (`_ask(timeout_s)`: a Notice or
    None) until a notice comes, the timeout passes or close() is called. A service that does
    not answer, or answers what its documentation does not say, is logged (once per kind of
    trouble) and asked again at the next poll: nothing it answers stops the watcher."""

    name = "polling"

    def request_s(self, deadline: float) -> float:
        """How long one request may take: what is left of the watch (at least MIN_REQUEST_S),
        at most one poll and 5 s."""
        return min(self.config.poll_s + 5.0, max(MIN_REQUEST_S, deadline - time.monotonic()))

    def next(self, timeout_s: float) -> Notice | None:
        deadline = time.monotonic() + timeout_s
        while not self._stop.is_set():
            try:
                notice = self._ask(self.request_s(deadline))
            except OSError as exc:  # the service did not answer this time
                self.trouble(f"unreachable {type(exc).__name__}", "%s metadata at %s did not answer: %r",
                             self.cloud, self.base, exc)
                notice = None
            except Exception as exc:  # an answer of a shape its documentation does not give
                self.trouble(f"bad {type(exc).__name__} {str(exc).split(':')[0]}", "%s metadata at %s: %s; ignored", self.cloud, self.base,
                             " ".join(str(exc).split())[:200])
                notice = None
            if notice is not None:
                return notice
            if self._stop.wait(max(0.0, min(self.config.poll_s, deadline - time.monotonic()))) \
                    or time.monotonic() >= deadline:
                return None
        return None

    @abc.abstractmethod
    def _ask(self, timeout_s: float) -> Notice | None:
        """One request to the service: a Notice, or None when it says none is coming."""

