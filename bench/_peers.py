"""Baseline ways to move one payload between two processes, measured beside rlboost.transfer.

Every sender maps the same shared payload (see _common.SharedPayload). Sessions keep their
processes open across runs so that `run_interleaved` can alternate them; ucxx runs on
its own in two children (UCX options are per process).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import logging
import os
import shutil
import socket
import tempfile
import time

import numpy as np

from _common import (
    Child,
    Expect,
    MiB,
    Row,
    Schedule,
    alloc_prefaulted,
    check,
    digest,
    free_port,
    open_payload,
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
        self.sender_pids: tuple[int, ...] = ()

    def prepare(self, nbytes: int) -> None:
        pass

    def once(self, n: int) -> None:
        if self.use_torch:
            self.dst_t[:n].copy_(self.ref_t[:n])
        else:
            np.copyto(self.dst[:n], self.ref[:n])

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- raw socket
def _recv_into(sock: socket.socket, view: memoryview, chunk: int) -> None:
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got : min(got + chunk, total)])
        if n == 0:
            raise ConnectionError("sender closed early")
        got += n


def serve_socket(conn, path: str, max_bytes: int, chunk: int) -> None:
    """Child: answer each 8-byte size request with that many payload bytes."""
    view = memoryview(open_payload(path, max_bytes))
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

    def __init__(self, dst: np.ndarray, path: str, max_bytes: int):
        self.view = memoryview(dst)
        self.child = Child(serve_socket, path, max_bytes, SOCKET_CHUNK)
        self.sender_pids = (self.child.proc.pid,)
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


def serve_gloo(conn, path: str, max_bytes: int, port: int) -> None:
    """Child: rank 0, broadcasts the first n payload bytes on each ("bcast", n)."""
    import torch
    import torch.distributed as dist

    src = torch.from_numpy(open_payload(path, max_bytes))
    conn.send(("ready", None))
    _gloo_init(port, rank=0)
    try:
        while (command := wait_command(conn))[0] == "bcast":
            dist.barrier()
            dist.broadcast(src[: command[1]], src=0)
    finally:
        dist.destroy_process_group()


class GlooSession:
    """torch.distributed broadcast over gloo, two processes; receiver-timed after a barrier."""

    key, peer, note = "gloo", "gloo broadcast", "timed after a barrier"

    def __init__(self, dst: np.ndarray, path: str, max_bytes: int):
        import torch

        self.dst_t = torch.from_numpy(dst)
        port = free_port()
        self.child = Child(serve_gloo, path, max_bytes, port)
        self.sender_pids = (self.child.proc.pid,)
        try:
            self.child.expect("ready")
            _gloo_init(port, rank=1)
        except BaseException:
            self.child.close(timeout=1.0)
            raise

    def prepare(self, nbytes: int) -> None:
        pass

    def once(self, n: int) -> float:
        import torch.distributed as dist

        self.child.send("bcast", n)
        dist.barrier()
        t0 = time.perf_counter()
        dist.broadcast(self.dst_t[:n], src=0)
        return time.perf_counter() - t0

    def close(self) -> None:
        import torch.distributed as dist

        self.child.send("stop")
        dist.destroy_process_group()
        self.child.close()


# --------------------------------------------------------------------------- Ray
class RaySource:
    """Actor holding the payload; each call returns a slice, which Ray writes into the
    object store of the actor's node (the put)."""

    def __init__(self, path: str, max_bytes: int):
        self.src = open_payload(path, max_bytes)

    def produce(self, n: int) -> np.ndarray:
        return self.src[:n]


class RayCluster:
    """Two Ray nodes on this machine, each a raylet with its own object store: the
    driver's node and a second one, so an object put on the second is moved by Ray's
    object manager over loopback TCP, as between two hosts.

    RAY_TMPDIR points at a directory of its own: Ray records the address of a cluster
    started this way in its temp dir, where any plain ray.init() on the machine would
    find and join it."""

    def __init__(self, path: str, max_bytes: int):
        import ray
        from ray.cluster_utils import Cluster

        here = os.path.dirname(os.path.abspath(__file__))
        # Workers start from the raylet's environment and must import this module.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (here, os.environ.get("PYTHONPATH")) if p)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        self.temp_dir = tempfile.mkdtemp(prefix="rlb-ray-")
        os.environ["RAY_TMPDIR"] = self.temp_dir
        store = 2 * max_bytes + 256 * MiB
        self.ray, self.cluster = ray, None
        try:
            self.cluster = Cluster(initialize_head=True, head_node_args=dict(
                num_cpus=0, object_store_memory=store, include_dashboard=False))
            self.far = self.cluster.add_node(num_cpus=0, object_store_memory=store)
            ray.init(address=self.cluster.address, logging_level=logging.ERROR,
                     log_to_driver=False)
        except BaseException:
            self.close()
            raise
        self.path, self.max_bytes = path, max_bytes

    def source(self, cross_node: bool):
        """A RaySource actor on the second node, or on the driver's."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = self.far.node_id if cross_node else self.ray.get_runtime_context().get_node_id()
        return self.ray.remote(num_cpus=0)(RaySource).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote(self.path, self.max_bytes)

    def raylet_pid(self, cross_node: bool) -> int:
        from ray._private import ray_constants

        node = self.far if cross_node else self.cluster.head_node
        return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid

    def close(self) -> None:
        self.ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        os.environ.pop("RAY_TMPDIR", None)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class RaySession:
    """Ray object store, timed as a consumer of an object already put, the way a pull
    is timed against a version already published: per run an actor puts a fresh object
    (untimed), then the driver times ray.get + one copy into the destination.

    Same host: the actor shares the driver's node, so get maps its plasma shared memory
    (zero-copy) and the copy is the only pass over the bytes. Cross node: the actor is on
    the second node, so get first has Ray's object manager move the object into the
    driver's store over TCP. The get's zero-copy array is read-only plasma memory, so
    the copy is what puts the bytes where a consumer (like a puller) wants them.
    """

    def __init__(self, cluster: RayCluster, dst: np.ndarray, cross_node: bool):
        self.ray, self.dst = cluster.ray, dst
        where = "cross-node" if cross_node else "same-host"
        self.key = f"ray_{where.replace('-', '_')}"
        self.peer = f"ray get ({where})"
        self.note = "object manager, TCP" if cross_node else "plasma shm"
        # The put's copy runs in the actor's worker (not counted, like a publish).
        self.sender_pids = tuple({cluster.raylet_pid(False), cluster.raylet_pid(cross_node)})
        self.actor = cluster.source(cross_node)
        # Fault in both object stores' memory first, as every other peer's buffers are.
        for _ in range(2):
            self.once(cluster.max_bytes)

    def prepare(self, nbytes: int) -> None:
        pass

    def once(self, n: int) -> float:
        ref = self.actor.produce.remote(n)
        self.ray.wait([ref], fetch_local=False)
        t0 = time.perf_counter()
        np.copyto(self.dst[:n], self.ray.get(ref))
        took = time.perf_counter() - t0
        del ref  # frees the object in both stores before the next run
        return took

    def close(self) -> None:
        self.ray.kill(self.actor)


# --------------------------------------------------------------------------- UCX (ucxx)
def ucx_installed() -> bool:
    return importlib.util.find_spec("ucxx") is not None


async def _ucx_main(conn, role: str, path: str, schedule: Schedule) -> None:
    import ucxx

    max_bytes = max(schedule.sizes)
    buf = open_payload(path, max_bytes) if role == "server" else alloc_prefaulted(max_bytes)
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


def ucx_side(conn, role: str, path: str, schedule: Schedule) -> None:
    asyncio.run(_ucx_main(conn, role, path, schedule))


def measure_ucx(schedule: Schedule, path: str, expect: Expect, tls: str | None) -> list[Row]:
    """ucxx tag send/recv between two children; tls=None lets UCX pick (cma/shm on one host)."""
    env = {"UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    if tls:
        env["UCX_TLS"] = tls
    name, key = f"ucxx tag ({tls or 'auto'})", f"ucxx_{tls or 'auto'}"
    with Child(ucx_side, "server", path, schedule, env=env) as server, \
            Child(ucx_side, "client", path, schedule, env=env) as client:
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
