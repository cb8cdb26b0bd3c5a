"""Slow-loris holders for the admission tests, run as a separate process: keeps `per_address`
connections open to a weight server from each of `count` loopback addresses (127.0.0.N
from `first`), never sending a byte, and opens a new one for each the server closes, for
`seconds`. Prints how many it opened as one JSON line.

    python -m tests.transfer.loris HOST:PORT SECONDS FIRST COUNT PER_ADDRESS [NICENESS]
"""

from __future__ import annotations

import errno
import json
import os
import resource
import select
import socket
import sys
import time


def hold(host: str, port: int, seconds: float, first: int, count: int, per_address: int) -> int:
    socks: dict[int, socket.socket] = {}
    poller = select.epoll()
    opened, k = 0, 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        while len(socks) < per_address * count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.bind((f"127.0.0.{first + k % count}", 0))
            except OSError:
                s.close()
                break
            k += 1
            if s.connect_ex((host, port)) not in (0, errno.EINPROGRESS):
                s.close()
                break
            socks[s.fileno()] = s
            poller.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
            opened += 1
        for fd, _ in poller.poll(0.05):  # closed by the server (or refused): open another
            poller.unregister(fd)
            socks.pop(fd).close()
    for s in socks.values():
        s.close()
    return opened


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if len(sys.argv) > 6:
        os.nice(int(sys.argv[6]))
    host, port = sys.argv[1].rsplit(":", 1)
    opened = hold(host, int(port), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    print(json.dumps({"opened": opened}), flush=True)


if __name__ == "__main__":
    main()
