"""Slow-loris below the budgets: holders on 8 loopback addresses keep hundreds of idle
connections open each (reopening every one the server closes), more than the kernel's
accept queue holds, at the server's own priority on the same cores. The listener defers
accepting a connection until its first bytes arrive (TCP_DEFER_ACCEPT: clients speak
first), so connections that never send one wait in the kernel's handshake queue and the
accept queue never overflows; an honest puller's connection is then accepted at once
instead of waiting out a dropped SYN's one-second retransmission. Asserts that every honest
pull succeeds and that the kernel dropped no connection from a full accept queue
(TcpExtListenOverflows); prints the figures (connections opened, honest pulls, median and
worst times, loaded and not, their ratio, the accept queue's peak depth), which are timings
and so not asserted."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import pytest
import torch

from rlboost.transfer import WeightPublisher

from .adversaries import LegitPullerForTests
from .helpers import make_config

LORIS_S, ADDRESSES, PER_ADDRESS = 12.0, 8, 600
NICENESS = 0  # the holders compete with the server for the same cores: harsher than holders elsewhere
PAUSE_S = 0.05


@pytest.mark.slow
def test_holders_on_eight_addresses_leave_honest_logins_their_pace():
    blob = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    overflows_before = listen_overflows()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with WeightPublisher(make_config(handshake_timeout_s=1.0)) as pub:
        pub.publish(1, {"blob": blob})
        legit = LegitPullerForTests(pub.address, make_config(relay=False, transport="tcp", keep_connections=False),
                                    {"blob": blob})
        unloaded = []
        for _ in range(20):
            unloaded.append(legit.pull_once())
            time.sleep(PAUSE_S)
        holders = [subprocess.Popen([sys.executable, "-m", "tests.transfer.loris", pub.address, str(LORIS_S),
                                     str(2 + i * ADDRESSES // 2), str(ADDRESSES // 2), str(PER_ADDRESS), str(NICENESS)],
                                    stdout=subprocess.PIPE, text=True, cwd=root) for i in range(2)]
        loaded, failures = [], []
        while any(h.poll() is None for h in holders):
            try:
                loaded.append(legit.pull_once())
            except Exception as exc:  # counted: the test asserts there are none
                failures.append(f"{type(exc).__name__}: {exc}")
            time.sleep(PAUSE_S)
        opened = sum(json.loads(h.communicate()[0])["opened"] for h in holders)
        stats = pub.stats()
        legit.stop()
    overflows = listen_overflows() - overflows_before
    ratio = statistics.median(loaded) / statistics.median(unloaded)
    print(f"\n[loris] {opened} connections held from {ADDRESSES} addresses; accept queue peak "
          f"{stats.get('accept_queue_peak', '?')}; honest pulls: {len(loaded)} ok, {len(failures)} failed, median "
          f"{statistics.median(loaded) * 1e3:.1f} ms (unloaded {statistics.median(unloaded) * 1e3:.1f} ms, "
          f"x{ratio:.2f}), max {max(loaded) * 1e3:.0f} ms; kernel accept-queue overflows {overflows}")
    assert loaded and not failures, failures[:5]
    assert overflows == 0, f"the kernel dropped {overflows} connections from a full accept queue"


def listen_overflows() -> int:
    """This machine's count of connections dropped because a listener's accept queue was full."""
    with open("/proc/net/netstat") as f:
        lines = [line.split() for line in f if line.startswith("TcpExt:")]
    return int(dict(zip(lines[0][1:], lines[1][1:]))["ListenOverflows"])
