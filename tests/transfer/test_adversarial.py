"""The transfer core under attack, each attack with an honest puller pulling throughout and
checking every byte: an on-path proxy forging chunks (CRC-32C kept), peers that stall or
trickle before and after login until every slot is taken, sources that answer with hostile
error frames, and a peer hoarding shared-memory leases. The default run holds short
versions; `-m slow` runs the 256-peer one and prints per-pull times and deadline overruns."""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time

import pytest
import torch

from rlboost.errors import IntegrityError, TransferError
from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .adversaries import (
    ChunkForgingProxyForTests,
    LeaseHoarderForTests,
    LegitPullerForTests,
    SlowPeerSwarm,
    forge_crc32c,
)
from .helpers import SECRET, make_config, wait_until
from .wire_client import W, frame, recv_frame

LOGIN_S, FRAME_S = 1.0, 1.5  # the server's deadlines in these tests


def _payload(nbytes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"blob": torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)}


def test_crc_forging_helper_keeps_the_checksum():
    from rlboost import _C

    data = bytearray(torch.randint(0, 256, (1000,), dtype=torch.uint8).numpy().tobytes())
    target = _C.crc32c(b"something else")
    forge_crc32c(data, target)
    assert _C.crc32c(bytes(data)) == target


@pytest.mark.parametrize("transport", ["tcp"])
def test_a_proxy_forging_every_chunk_with_its_crc_kept_fails_every_pull_with_an_integrity_error(transport):
    expected = _payload(1 << 20)
    with WeightPublisher(make_config()) as pub:
        pub.publish(1, expected)
        legit = LegitPullerForTests(pub.address, make_config(transport=transport, relay=False), expected).start()
        proxy = ChunkForgingProxyForTests(pub.address)
        try:
            for _ in range(3):
                with WeightPuller(proxy.address, make_config(transport=transport, relay=False)) as victim:
                    with pytest.raises(IntegrityError, match="does not match its tag"):
                        victim.pull(1, timeout=60)
            assert proxy.forged >= 3
        finally:
            proxy.close()
            legit.stop()
    assert legit.failures == [] and legit.seconds


def _hostile_error_source(message: bytes) -> tuple[str, threading.Thread, object]:
    """A listener that answers every hello with an error frame carrying `message`."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    recv_frame(conn)
                    conn.sendall(frame(W["error"], struct.pack("<I", 2) + message))
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{listener.getsockname()[1]}", t, listener


@pytest.mark.parametrize("message", [b"\xff\xfe\x80 not utf-8 \xc3", b"\x1b[31mred\x1b[0m" * 40, b""])
def test_hostile_error_frames_are_skipped_reported_and_never_fatal(message):
    expected = _payload(300_000)
    address, thread, listener = _hostile_error_source(message)
    try:
        with WeightPublisher(make_config()) as pub:
            pub.publish(1, expected)
            legit = LegitPullerForTests(pub.address, make_config(relay=False), expected).start()
            with WeightPuller([address, pub.address], make_config(relay=False)) as puller:
                handle = puller.prepare(1)
                assert torch.equal(handle.start().wait(60)["blob"], expected["blob"])
                (skipped,) = handle.skipped_sources
                assert skipped.startswith(address) and skipped.isprintable()
            with WeightPuller(address, make_config(relay=False)) as alone, pytest.raises(TransferError) as info:
                alone.pull(1)
            assert str(info.value).isprintable()
            legit.stop()
        assert legit.failures == [] and legit.seconds
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=10)


def _swarm_server(**limits) -> ServerConfig:
    return ServerConfig(**limits)


def _run_swarm(counts: dict[str, int], server: ServerConfig, nbytes: int, pulls: int, label: str,
               loaded_s: float = 0.0) -> dict:
    """Pulls unloaded, then under the swarm (`pulls` times, and for at least loaded_s so that
    peers reach their deadlines); prints the figures and returns them."""
    expected = _payload(nbytes)
    config = make_config(publisher=server, handshake_timeout_s=LOGIN_S, frame_timeout_s=FRAME_S,
                         chunk_bytes=1 << 20)
    with WeightPublisher(config) as pub:
        pub.publish(1, expected)
        legit = LegitPullerForTests(pub.address, make_config(relay=False, transport="tcp", chunk_bytes=1 << 20),
                                    expected)
        unloaded = [legit.pull_once() for _ in range(pulls)]
        swarm = SlowPeerSwarm(pub.address, SECRET, counts).start()
        try:
            assert wait_until(lambda: swarm.open_now() >= sum(counts.values()) // 2, timeout=60)
            loaded, until = [], time.monotonic() + loaded_s
            while len(loaded) < pulls or time.monotonic() < until:
                loaded.append(legit.pull_once())  # raises if any pull fails or differs
            # Every stalled or trickling connection is closed by the server (by its deadline or
            # for a newcomer), and the swarm keeps replacing them.
            assert wait_until(lambda: sum(c.closed is not None for c in swarm.connections) >= sum(counts.values()),
                              timeout=60)
        finally:
            swarm.stop()
            legit.stop()
        stats = pub.stats()
    deadlines = {"stall-login": LOGIN_S, "trickle-login": LOGIN_S, "stall-frame": FRAME_S, "trickle-frame": FRAME_S}
    over = swarm.overruns(deadlines)
    report = {"unloaded_s": statistics.median(unloaded), "loaded_max_s": max(loaded),
              "loaded_median_s": statistics.median(loaded), "max_overrun_s": max(over), "closed": len(over),
              "evicted": stats["connections_evicted"] + stats["stalled_evicted"],
              "handshakes_dropped": stats["handshakes_dropped"], "deadlines_missed": stats["deadlines_missed"]}
    print(f"\n[{label}] {len(loaded)} pulls of {nbytes >> 20} MiB: unloaded median {report['unloaded_s'] * 1e3:.0f} ms, "
          f"loaded median {report['loaded_median_s'] * 1e3:.0f} ms, max {report['loaded_max_s'] * 1e3:.0f} ms "
          f"(x{report['loaded_max_s'] / report['unloaded_s']:.1f}); attacker connections closed: {report['closed']}, "
          f"latest {report['max_overrun_s']:+.2f} s past its deadline; server: {stats['stalled_evicted']} stalled and "
          f"{stats['connections_evicted']} idle evicted, {stats['handshakes_dropped']} logins dropped, "
          f"{stats['deadlines_missed']} deadlines missed")
    return report


def test_stalled_and_trickling_peers_before_and_after_login_cannot_lock_out_an_honest_puller():
    # Caps small enough that a few peers fill every slot, authenticated and not.
    server = _swarm_server(max_connections=8, max_connections_per_host=8, max_handshakes=24)
    counts = {"stall-login": 6, "trickle-login": 6, "stall-frame": 6, "trickle-frame": 6}
    report = _run_swarm(counts, server, 4 << 20, pulls=5, label="short")
    assert report["closed"] >= sum(counts.values())


@pytest.mark.slow
def test_256_stalled_or_trickling_peers_leave_an_honest_puller_its_pulls():
    counts = {"stall-login": 64, "trickle-login": 64, "stall-frame": 64, "trickle-frame": 64}
    _run_swarm(counts, ServerConfig(), 64 << 20, pulls=10, label="256 peers", loaded_s=4 * FRAME_S)


def test_a_peer_hoarding_shared_memory_leases_cannot_pin_old_versions():
    nbytes, kept = 2 << 20, 2
    # Served versions plus one retired version still leased (a pull of it may be running)
    # or kept for the next publish, however many leases the hoarder holds; and for each
    # served version the one-byte marker of its declined delta (these random payloads
    # share nothing).
    bound = (kept + 1) * nbytes + kept
    config = make_config(publisher=ServerConfig(versions_kept=kept), transport="shm", relay=False)
    with WeightPublisher(config) as pub:
        hoarder = LeaseHoarderForTests(pub.address, SECRET)
        try:
            for v in range(1, 9):
                expected = _payload(nbytes, seed=v)
                pub.publish(v, expected)
                hoarder.lease(v)
                with WeightPuller(pub.address, config) as legit:
                    assert torch.equal(legit.pull(v, timeout=60)["blob"], expected["blob"])
                # A revoked lease is released by its connection's thread as it ends.
                assert wait_until(lambda: pub.stats()["held_bytes"] <= bound, timeout=10), pub.stats()["held_bytes"]
        finally:
            hoarder.close()
        # Each revocation ends the hoarder's connection and every lease on it.
        assert hoarder.granted >= 8 and hoarder.reconnects >= 2 and pub.stats()["leases_revoked"] >= 2


def test_retiring_a_leased_version_revokes_the_lease_instead_of_waiting():
    config = make_config(publisher=ServerConfig(versions_kept=8), transport="shm", relay=False)
    with WeightPublisher(config) as pub:
        for v in (1, 2, 3):
            pub.publish(v, _payload(1 << 20, seed=v))
        hoarder = LeaseHoarderForTests(pub.address, SECRET)
        try:
            hoarder.lease(1)
            assert hoarder.granted == 1
            pub.retire(1, timeout=10)  # returns: the lease is revoked, not waited for
            assert pub.stats()["leases_revoked"] == 1 and pub.versions == [2, 3]
            hoarder.lease(2)  # the hoarder was disconnected; it may come back for others
            assert hoarder.reconnects == 1 and hoarder.granted == 2
        finally:
            hoarder.close()
