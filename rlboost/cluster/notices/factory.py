"""Choosing a node's notice watcher by name, as engines are chosen by backend: one class
per source (aws, gcp, azure, none); `auto` asks each cloud's metadata endpoint once."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from rlboost.cluster.notices.aws import AwsNotices
from rlboost.cluster.notices.azure import AzureNotices
from rlboost.cluster.notices.base import CLOUDS, NOTICE_SOURCES, NoNotices, NoticeConfig, NoticeWatcher
from rlboost.cluster.notices.gcp import GcpNotices
from rlboost.validate import require

log = logging.getLogger(__name__)


def watcher_classes() -> dict[str, type]:
    return {"aws": AwsNotices, "gcp": GcpNotices, "azure": AzureNotices, "none": NoNotices}


def detect(config: NoticeConfig) -> str:
    """`auto`: the first cloud whose metadata endpoint answers as that cloud's does (each asked
    once, all at once, within probe_timeout_s), else "none"."""
    classes = watcher_classes()
    with ThreadPoolExecutor(len(CLOUDS)) as pool:
        answers = {name: pool.submit(classes[name].probe, config) for name in CLOUDS}
        for name in CLOUDS:
            try:
                if answers[name].result():
                    return name
            except Exception as exc:  # an odd answer: not this cloud
                log.info("notice source %s did not probe: %r", name, exc)
    return "none"


def build_watcher(source: str, config: NoticeConfig) -> NoticeWatcher:
    """The watcher of a source in NOTICE_SOURCES (auto: detect() picks one)."""
    require(source in NOTICE_SOURCES, "cluster.notice_source", f"one of {NOTICE_SOURCES}", source)
    name = detect(config) if source == "auto" else source
    return watcher_classes()[name](config)
