"""Baseline ways to move one payload between two processes, measured beside rlboost.transfer.

Each `measure_*` (or `*Session`) runs the sending side in a child process, receives into
the caller's pre-faulted buffer (or a pre-faulted buffer of a second child) and checks
the bytes.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import logging
import os
import socket
import time

import numpy as np

from _common import (
    MiB,
    Child,
    Expect,
    Row,
    Schedule,
    alloc_prefaulted,
    check,
    digest,
    free_port,
    source_buffer,
    time_runs,
    wait_command,
)

SOCKET_CHUNK = 4 * MiB


# --------------------------------------------------------------------------- memcpy
class MemcpySession:
    """The ceiling: one copy between two resident buffers in one process."""

    def __init__(self, ref: np.ndarray, dst: np.ndarray, use_torch: bool):
        import torch

        self.ref, self.dst = ref, dst
        self.ref_t, self.dst_t = torch.from_numpy(ref), torch.from_numpy(dst)
        self.use_torch = use_torch
        self.key = "memcpy_torch" if use_torch else "memcpy_numpy"
        self.peer = "memcpy (torch)" if use_torch else "memcpy (numpy)"
        self.note = f"{torch.get_num_threads()} threads" if use_torch else "1 thread"

    def prepare(self, nbytes: int) -> None:
        pass

    def once(self, n: int) -> None:
        if self.use_torch:
            self.dst_t[:n].copy_(self.ref_t[:n])
        else:
            np.copyto(self.dst[:n], self.ref[:n])


# --------------------------------------------------------------------------- raw socket
def _recv_into(sock: socket.socket, view: memoryview, chunk: int) -> None:
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got : min(got + chunk, total)])
        if n == 0:
            raise ConnectionError("sender closed early")
        got += n


def serve_socket(conn, max_bytes: int, seed: int, chunk: int) -> None:
    """Child: answer each 8-byte size request with that many payload bytes."""
    view = memoryview(source_buffer(max_bytes, seed))
    with socket.create_server(("127.0.0.1", 0)) as server:
        conn.send(("ready", server.getsockname()[1]))
        sock, _ = server.accept()
    head = bytearray(8)
    with sock:
        while True:
            _recv_into(sock, memoryview(head), 8)
            n = int.from_bytes(head, "little")
            if n == 0:
                return
            for off in range(0, n, chunk):
                sock.sendall(view[off : min(off + chunk, n)])


class SocketSession:
    """One TCP stream on 127.0.0.1, Python sendall / recv_into, 4 MiB chunks."""

    key, peer, note = "socket", "raw socket (1 stream)", "4 MiB chunks"

    def __init__(self, dst: np.ndarray, max_bytes: int, seed: int):
        self.view = memoryview(dst)
        self.child = Child(serve_socket, max_bytes, seed, SOCKET_CHUNK)
        try:
            self.sock = socket.create_connection(("127.0.0.1", self.child.expect("ready")))
        except BaseException:
            self.child.close(timeout=1.0)
            raise

    def prepare(self, nbytes: int) -> None:
        pass

    def once(self, n: int) -> None:
        self.sock.sendall(n.to_bytes(8, "little"))
        _recv_into(self.sock, self.view[:n], SOCKET_CHUNK)

    def close(self) -> None:
        with self.sock:
            self.sock.sendall(bytes(8))
        self.child.close()


# --------------------------------------------------------------------------- gloo
def _gloo_init(port: int, rank: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=120))


def serve_gloo(conn, seed: int, port: int, schedule: Schedule) -> None:
    """Child: rank 0 broadcasts the payload once per scheduled run."""
    import torch
    import torch.distributed as dist

    src = torch.from_numpy(source_buffer(max(schedule.sizes), seed))
    conn.send(("ready", None))
    _gloo_init(port, rank=0)
    for n in schedule.sizes:
        for _ in range(schedule.runs()):
            dist.barrier()
            dist.broadcast(src[:n], src=0)
    dist.destroy_process_group()


def measure_gloo(dst: np.ndarray, schedule: Schedule, seed: int, expect: Expect) -> list[Row]:
    """torch.distributed broadcast over gloo, two processes; receiver-timed after a barrier."""
    import torch
    import torch.distributed as dist

    port, dst_t, rows = free_port(), torch.from_numpy(dst), []
    with Child(serve_gloo, seed, port, schedule) as child:
        child.expect("ready")
        _gloo_init(port, rank=1)
        try:
            for n in schedule.sizes:
                dst[:n] = 0
                times = []
                for i in range(schedule.runs()):
                    dist.barrier()
                    t0 = time.perf_counter()
                    dist.broadcast(dst_t[:n], src=0)
                    if i >= schedule.warmup:
                        times.append(time.perf_counter() - t0)
                rows.append(Row("gloo", "gloo broadcast", n, times))
                check("gloo", digest(dst[:n]), expect, n)
        finally:
            dist.destroy_process_group()
    return rows


# --------------------------------------------------------------------------- Ray
class RaySource:
    """Actor holding the payload; each call returns a slice, which Ray puts in plasma."""

    def __init__(self, max_bytes: int, seed: int):
        self.src = source_buffer(max_bytes, seed)

    def produce(self, n: int) -> np.ndarray:
        return self.src[:n]


def measure_ray(dst: np.ndarray, schedule: Schedule, seed: int, expect: Expect) -> list[Row]:
    """Ray object store: actor put (serialize into plasma) + driver get + one copy into dst.

    A get of a numpy array maps plasma zero-copy, so the copy into the destination is
    what makes the bytes usable where a puller would put them.
    """
    import ray

    here = os.path.dirname(os.path.abspath(__file__))
    # Workers start from the raylet's environment and must import this module.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=1, object_store_memory=2 * max(schedule.sizes) + 256 * MiB,
             include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    rows = []
    try:
        actor = ray.remote(num_cpus=0)(RaySource).remote(max(schedule.sizes), seed)
        # Fault in the object store's memory first, as every other peer's buffers are.
        warm = [actor.produce.remote(max(schedule.sizes)) for _ in range(2)]
        ray.get(warm)
        del warm
        for n in schedule.sizes:
            dst[:n] = 0

            def once(n=n):
                np.copyto(dst[:n], ray.get(actor.produce.remote(n)))

            times = time_runs(once, schedule)
            rows.append(Row("ray", "ray object store", n, times, "put+get+copy"))
            check("ray", digest(dst[:n]), expect, n)
    finally:
        ray.shutdown()
    return rows


# --------------------------------------------------------------------------- UCX (ucxx)
def ucx_installed() -> bool:
    return importlib.util.find_spec("ucxx") is not None


async def _ucx_main(conn, role: str, seed: int, schedule: Schedule) -> None:
    import ucxx

    max_bytes = max(schedule.sizes)
    buf = source_buffer(max_bytes, seed) if role == "server" else alloc_prefaulted(max_bytes)
    conn.send(("address", bytes(ucxx.get_worker_address())))
    _, peer = wait_command(conn)
    # Error handling off: with it on UCX refuses the shared-memory transports.
    ep = await ucxx.create_endpoint_from_worker_address(
        ucxx.get_ucx_address_from_buffer(peer), endpoint_error_handling=False)
    head = np.zeros(1, dtype=np.uint64)
    if role == "server":
        while True:
            await ucxx.recv(head, tag=1)
            if int(head[0]) == 0:
                break
            await ep.send(buf[: int(head[0])], tag=2, force_tag=True)
    else:
        result = {}
        for n in schedule.sizes:
            buf[:n] = 0
            times = []
            for i in range(schedule.runs()):
                head[0] = n
                t0 = time.perf_counter()
                await ep.send(head, tag=1, force_tag=True)
                await ucxx.recv(buf[:n], tag=2)
                if i >= schedule.warmup:
                    times.append(time.perf_counter() - t0)
            result[n] = (times, digest(buf[:n]))
        head[0] = 0
        await ep.send(head, tag=1, force_tag=True)
        conn.send(("result", (result, sorted(ucxx.get_active_transports()))))
    wait_command(conn)  # keep the endpoint alive until the other side is done


def ucx_side(conn, role: str, seed: int, schedule: Schedule) -> None:
    asyncio.run(_ucx_main(conn, role, seed, schedule))


def measure_ucx(schedule: Schedule, seed: int, expect: Expect, tls: str | None) -> list[Row]:
    """ucxx tag send/recv between two children; tls=None lets UCX pick (cma/shm on one host)."""
    env = {"UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    if tls:
        env["UCX_TLS"] = tls
    name, key = f"ucxx tag ({tls or 'auto'})", f"ucxx_{tls or 'auto'}"
    with Child(ucx_side, "server", seed, schedule, env=env) as server, \
            Child(ucx_side, "client", seed, schedule, env=env) as client:
        server_addr, client_addr = server.expect("address"), client.expect("address")
        server.send("peer", client_addr)
        client.send("peer", server_addr)
        result, transports = client.expect("result", timeout=600)
        server.send("stop")
        client.send("stop")
    rows = []
    for n, (times, got) in result.items():
        check(name, got, expect, n)
        rows.append(Row(key, name, n, times, "tls " + ",".join(transports)))
    return rows
