"""A connection flood for the admission tests, run as a separate process: opens connections
to a weight server from loopback addresses 127.0.0.2 and up (each bound before connecting,
so no address runs out of ports), sends the start of a login on each, and resets it at once
(SO_LINGER 0: no TIME_WAIT), as fast as it can, for `seconds`. Prints how many connections
it opened (the TCP handshake completed) as one JSON line.

    python -m tests.transfer.flood HOST:PORT SECONDS FIRST_ADDRESS ADDRESSES [NICENESS]
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import struct
import sys
import time

BATCH = 256
LINGER_RESET = struct.pack("ii", 1, 0)


def flood(host: str, port: int, seconds: float, first: int, count: int, hello: bytes) -> int:
    opened, k = 0, 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        batch = []
        for _ in range(BATCH):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
            s.setblocking(False)
            try:
                s.bind((f"127.0.{(first + k) // 254}.{(first + k) % 254 + 1}", 0))
            except OSError:
                s.close()
                continue
            k = (k + 1) % count
            err = s.connect_ex((host, port))
            if err in (0, errno.EINPROGRESS):
                batch.append(s)
            else:
                s.close()
        if batch:
            _, ready, _ = select.select([], batch, [], 0.05)
            for s in ready:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    opened += 1
                    try:
                        s.send(hello)
                    except OSError:
                        pass
        for s in batch:
            s.close()  # a reset: the server's side is gone at once, and no port lingers
    return opened


def main() -> None:
    if len(sys.argv) > 5:
        os.nice(int(sys.argv[5]))  # attackers elsewhere would not share the server's cores
    host, port = sys.argv[1].rsplit(":", 1)
    hello = struct.pack("<IHHIIQ", 0x57424C52, 4, 1, 0, 44, 0) + bytes(44)
    n = flood(host, int(port), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), hello)
    print(json.dumps({"opened": n}), flush=True)


if __name__ == "__main__":
    main()
