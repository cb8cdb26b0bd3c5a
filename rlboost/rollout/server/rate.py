"""What an engine that streams from processes of its own (SGLang, vLLM) reports in load():
DecodeRate, the tokens/s it decodes measured over its recent busy time only (idle gaps
between steps do not dilute the rate the router and the offload policy read), and
LoadCounts, its running and queued samples."""

from __future__ import annotations

import time
from collections import deque


class DecodeRate:
    """Usage: rate.busy() when work arrives, rate.add(n) per n tokens received, rate.idle()
    when no work is left (the next busy period is measured on its own); rate.value is the
    latest tokens/s (kept while idle)."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.value = 0.0
        self._arrivals: deque[tuple[float, int]] = deque()
        self._busy_since: float | None = None

    def busy(self) -> None:
        if self._busy_since is None:
            self._busy_since = time.perf_counter()

    def add(self, n: int) -> float:
        now = time.perf_counter()
        self._arrivals.append((now, n))
        while self._arrivals[0][0] < now - self.window_s:
            self._arrivals.popleft()
        span = now - max(self._busy_since or now, now - self.window_s)
        if span > 0:
            self.value = sum(k for _, k in self._arrivals) / span
        return self.value

    def idle(self) -> None:
        self._busy_since = None
        self._arrivals.clear()


class LoadCounts:
    """Samples decoding, samples waiting for their first token, and the tokens all of them
    may still produce: the engine thread adds (+1) and takes out (-1) each sample's share."""

    def __init__(self) -> None:
        self.running = self.queued = self.queued_tokens = 0

    def add(self, started: bool, remaining: int, sign: int) -> None:
        self.running += sign * int(started)
        self.queued += sign * (1 - int(started))
        self.queued_tokens += sign * remaining

    def snapshot(self) -> tuple[int, int, int]:
        return self.running, self.queued, self.queued_tokens
