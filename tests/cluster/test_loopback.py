"""A local run's Ray cluster listens on 127.0.0.1 only: its GCS, raylet, agents and every
worker (the run's actors) as well as the driver itself. The socket table of the kernel
(/proc/net/tcp, tcp6) is read for the processes of this test's own tree.

The test starts from what `rlboost train` sees: Ray imported before the run set
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER (Ray reads it once, at import)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import ray
from own_processes import descendants, name_of
from ray._private import ray_constants

from rlboost.cluster.session import RaySession, RaySettings, actor_options

LISTEN = "0A"


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_ip)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


def listening(pids: set[int]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every TCP socket the processes listen on."""
    sockets: dict[str, tuple[str, int]] = {}  # inode -> address
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                ip, port = fields[1].split(":")
                sockets[fields[9]] = (str(_address(ip)), int(port, 16))
    found = []
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # ended meanwhile
            continue
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in sockets:
                found.append((name_of(pid), *sockets[link[8:-1]]))
    return found


def test_a_local_cluster_and_the_run_s_actors_listen_on_loopback_only(monkeypatch):
    from ray._common.usage.usage_lib import usage_stats_enabled

    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)  # as imported without the variable

    class ActorOfTheRun:
        def pid(self) -> int:
            return os.getpid()

        def niceness(self) -> int:
            return os.nice(0)

    with RaySession(RaySettings(num_cpus=1, reserved=1, preemptible=1, object_store_mb=128)):
        actor = ray.remote(ActorOfTheRun).options(**actor_options("reserved")).remote()
        worker = ray.get(actor.pid.remote(), timeout=60)
        assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"
        tree = {os.getpid(), *descendants(os.getpid())}
        assert worker in tree
        sockets = listening(tree)
        outside = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
        assert not outside, outside
        names = {name for name, _, _ in sockets}
        assert {"gcs_server", "raylet"} <= names, sockets  # the cluster's own servers were seen
        assert any(pid == worker for pid in tree if name_of(pid).startswith("ray::"))
        assert not usage_stats_enabled()  # Ray reports nothing to its maintainers' server
        # the run's actors are its work: not started below the driver's priority (Ray's own
        # default, nice 15, starved them behind any busy process on a shared host)
        assert ray.get(actor.niceness.remote(), timeout=60) == os.nice(0)
    assert ray_constants.ENABLE_RAY_CLUSTER is True  # Ray's setting is back once the run's cluster is gone
