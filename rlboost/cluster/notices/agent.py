"""NodeNoticeAgent: a light Ray actor on one preemptible node that hears the node's notices
(its cloud's watcher and its shutdown hook's socket) and hands each to the run's driver,
which keeps one next_notice() call waiting on every agent. A notice waiting on the node
loses the time it waited from its grace, so the deadline stays the cloud's. An agent whose
socket folder is not its user's alone refuses to start: another user could listen there in
its place.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from rlboost.cluster.notices.base import Notice, NoticeConfig
from rlboost.cluster.notices.factory import build_watcher
from rlboost.cluster.notices.hook import HookListener, _Pending, socket_path

WATCH_SLICE_S = 5.0  # one watcher call at most; close() returns within it
log = logging.getLogger(__name__)


class NodeNoticeAgent:
    """The actor class (ray.remote(max_concurrency=4): next_notice() blocks while drained()
    and close() come in). source: a name of NOTICE_SOURCES (auto probes here, on the node)."""

    def __init__(self, config: NoticeConfig, source: str, node_id: str):
        self.node_id = node_id
        self._queue: queue.Queue[_Pending] = queue.Queue()
        self._given: list[_Pending] = []
        self._stop = threading.Event()
        # first: a folder another user holds stops the agent before it asks any cloud
        self.hook = HookListener(socket_path(config.hook_dir, node_id), self._queue.put) if config.hook else None
        self.watcher = build_watcher(source, config)
        self._thread = threading.Thread(target=self._watch, name="notice-watch", daemon=True)
        self._thread.start()

    def source(self) -> str:
        """The cloud this node's watcher asks (aws, gcp, azure) or none."""
        return self.watcher.name

    def next_notice(self, timeout_s: float) -> Notice | None:
        """The next notice (its grace less the time it waited here), or None after timeout_s."""
        try:
            pending = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        waited = time.monotonic() - pending.received
        pending.taken.set()
        self._given.append(pending)
        n = pending.notice
        return Notice(source=n.source, grace_s=max(0.0, n.grace_s - waited), detail=n.detail)

    def drained(self) -> None:
        """The run has moved every sample off this node: a hook waiting for it may return."""
        for pending in self._given:
            pending.drained.set()

    def _watch(self) -> None:
        failed = False
        while not self._stop.is_set():
            try:
                notice = self.watcher.next(WATCH_SLICE_S)
            except Exception:  # a watcher's bug: said once, and the watcher is asked again
                if not failed:
                    log.exception("the %s notice watcher failed; it is asked again", self.watcher.name)
                failed = True
                self._stop.wait(WATCH_SLICE_S)
                continue
            if notice is not None:
                self._queue.put(_Pending(notice, time.monotonic(), threading.Event(), threading.Event()))
                return  # a node is reclaimed once; the service repeats the same notice

    def close(self) -> None:
        self._stop.set()
        self.watcher.close()
        if self.hook is not None:
            self.hook.close()
