"""Sources that hold nothing, or stop answering, never hold a pull up: a relay that never
gets the version, one that gets it only later, sources that go silent, and a puller closed
while it long-polls a relay. Polls and deadlines here are far longer than any pull's
timeout, so a pull that waited one out would fail."""

import gc
import os
import socket
import threading

import pytest
import torch

from rlboost.errors import TransferClosed, TransferTimeout
from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import BUILT_TRANSPORTS, SECRET, assert_same, make_config, random_tensors, wait_for_bytes
from .wire_client import HostileSourceForTests

LONG = 30.0  # a long-poll period or deadline that no pull below may wait out
SHORT = 5.0  # how long any pull below may take


def _by_address(pulled) -> dict[str, dict]:
    return {s["address"]: s for s in pulled.stats["sources"]}


@pytest.mark.parametrize("transport", BUILT_TRANSPORTS)
def test_a_relay_that_never_holds_the_version_does_not_hold_up_pulls(publisher, transport):
    tensors = random_tensors(5)
    publisher.publish(1, tensors)
    cfg = make_config(transport=transport, relay_poll_s=LONG)
    with WeightPuller(publisher.address, cfg) as stuck, WeightPuller(publisher.address, cfg) as puller:
        stuck.pull(1)  # holds version 1 and never pulls a later one
        pulled = puller.pull(1)
        for version in range(2, 7):
            publisher.publish(version, tensors)
            pulled = puller.pull(version, into=pulled, sources=[publisher.address, stuck.relay_address],
                                 timeout=SHORT)
            assert_same(pulled, tensors)
            peer = _by_address(pulled)[stuck.relay_address]
            # Watched for the whole pull, asked for nothing, and not given up on.
            assert (peer["chunks"], peer["error"]) == (0, "")


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_relay_that_starts_the_version_during_a_pull_serves_it(transport):
    blob = torch.randint(0, 256, (2 << 20,), dtype=torch.uint8)
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=2_000_000))) as pub:
        pub.publish(1, {"blob": blob})
        cfg = make_config(transport=transport)
        with WeightPuller(pub.address, cfg) as late, WeightPuller([pub.address, late.relay_address], cfg) as puller:
            handle = puller.prepare(1).start()  # `late` does not hold version 1 yet
            late_handle = late.prepare(1).start()
            pulled = handle.wait(timeout=60)
            assert torch.equal(pulled["blob"], blob)
            assert torch.equal(late_handle.wait(timeout=60)["blob"], blob)
            peer = _by_address(pulled)[late.relay_address]
            assert peer["chunks"] > 0 and peer["error"] == ""
            assert pub.stats()["bytes_sent"] < 2 * blob.numel()


def test_a_relay_that_stalled_mid_version_does_not_hold_up_a_pull():
    payload = os.urandom(64 * 4096)
    good = HostileSourceForTests("well_behaved", SECRET, payload)
    stalling = HostileSourceForTests("stalls", SECRET, payload)
    cfg = make_config(request_timeout_s=LONG, relay_poll_s=LONG)
    try:
        with WeightPuller(stalling.address, cfg) as stalled, \
                WeightPuller([good.address, stalled.relay_address], cfg) as puller:
            stalled_handle = stalled.prepare(1).start()
            wait_for_bytes(stalled_handle, 4 * 4096)  # holds four chunks, and will get no more
            for _ in range(5):
                # Polls of the stalled relay bring no news for 30 s; its streams, opened over
                # its control connection, do not wait for them and serve what it holds.
                pulled = puller.pull(1, timeout=SHORT)
                assert bytes(pulled["blob"].numpy()) == payload
                assert _by_address(pulled)[stalled.relay_address]["chunks"] > 0
    finally:
        good.close()
        stalling.close()


def test_a_peer_that_never_answers_its_long_poll_does_not_hold_up_pulls():
    tensors = random_tensors(6)
    silent = HostileSourceForTests("pending_silent", SECRET, bytes(4096))
    cfg = make_config(transport="tcp", request_timeout_s=LONG, relay_poll_s=LONG)
    try:
        with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=500_000))) as pub, \
                WeightPuller([pub.address, silent.address], cfg) as puller:
            pub.publish(1, tensors)
            for _ in range(3):
                silent.have_requested.clear()
                handle = puller.prepare(1).start()
                assert silent.have_requested.wait(SHORT)  # polled, and the poll never returns
                assert_same(handle.wait(timeout=SHORT), tensors)
    finally:
        silent.close()


def test_a_source_that_stops_answering_new_connections_does_not_hold_up_a_pull():
    payload = os.urandom(64 * 4096)
    good = HostileSourceForTests("well_behaved", SECRET, payload)
    frozen = HostileSourceForTests("first_connection_only", SECRET, payload)
    # The frozen source's streams would wait out a 30 s handshake deadline.
    cfg = make_config(transport="tcp", relay=False, connect_timeout_s=LONG, request_timeout_s=LONG)
    try:
        with WeightPuller([good.address, frozen.address], cfg) as puller:
            pulled = puller.pull(1, timeout=SHORT)
            assert bytes(pulled["blob"].numpy()) == payload
            assert _by_address(pulled)[frozen.address]["chunks"] == 0
    finally:
        good.close()
        frozen.close()


def test_a_source_that_never_answers_the_handshake_is_left_out_at_its_connect_deadline(publisher):
    tensors = random_tensors(7)
    publisher.publish(1, tensors)
    with socket.create_server(("127.0.0.1", 0)) as mute:  # the kernel accepts; nobody answers
        mute_address = f"127.0.0.1:{mute.getsockname()[1]}"
        cfg = make_config(relay=False, connect_timeout_s=0.5, request_timeout_s=LONG)
        with WeightPuller([publisher.address, mute_address], cfg) as puller:
            pulled = puller.pull(1, timeout=SHORT)
            assert_same(pulled, tensors)
            assert list(_by_address(pulled)) == [publisher.address]


@pytest.mark.parametrize("stop", ["cancel", "close"])
def test_cancel_or_close_during_a_long_poll_ends_the_pull_promptly(stop):
    blob = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    silent = HostileSourceForTests("pending_silent", SECRET, bytes(4096))
    try:
        with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=200_000))) as pub:
            pub.publish(1, {"blob": blob})
            cfg = make_config(transport="tcp", request_timeout_s=LONG, relay_poll_s=LONG)
            puller = WeightPuller([pub.address, silent.address], cfg)
            handle = puller.prepare(1).start()
            assert silent.have_requested.wait(SHORT)
            wait_for_bytes(handle, 64 << 10)
            ender = threading.Thread(target=handle.cancel if stop == "cancel" else puller.close)
            ender.start()
            ender.join(SHORT)
            assert not ender.is_alive()
            with pytest.raises(TransferClosed):
                handle.wait(timeout=SHORT)
            puller.close()
    finally:
        silent.close()


def _task_and_fd_counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _settled_counts() -> tuple[int, int]:
    """The counts once they hold still for half a second: threads that earlier tests left
    winding down (a shared-memory mapping's reaper ends within its 200 ms poll) are gone."""
    tick = threading.Event()
    last = _task_and_fd_counts()
    for _ in range(20):
        tick.wait(0.5)
        now = _task_and_fd_counts()
        if now == last:
            return now
        last = now
    return last


def _pulls_with_idle_and_silent_sources() -> None:
    tensors = random_tensors(8)
    silent = HostileSourceForTests("pending_silent", SECRET, bytes(4096))
    cfg = make_config(relay_poll_s=LONG, request_timeout_s=LONG)
    try:
        with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=500_000))) as pub, \
                WeightPuller(pub.address, cfg) as stuck, WeightPuller(pub.address, cfg) as puller:
            pub.publish(1, tensors)
            stuck.pull(1)
            for version in range(2, 5):
                pub.publish(version, tensors)
                sources = [pub.address, stuck.relay_address, silent.address]
                assert_same(puller.pull(version, sources=sources, timeout=SHORT), tensors)
            handle = puller.prepare(version, sources=sources).start()
            handle.cancel()
            with pytest.raises(TransferClosed):
                handle.wait(timeout=SHORT)
    finally:
        silent.close()
    gc.collect()  # pull jobs join their threads when collected


def test_pulls_with_idle_and_silent_sources_leave_no_threads_or_descriptors():
    _pulls_with_idle_and_silent_sources()  # starts what lives for the process (checksum pool)
    before = _settled_counts()
    for _ in range(2):
        _pulls_with_idle_and_silent_sources()
    assert _task_and_fd_counts() == before


def test_stats_answer_while_a_stream_waits_on_a_handshake():
    payload = os.urandom(64 * 4096)
    stalling = HostileSourceForTests("stalls", SECRET, payload)  # keeps the pull running
    frozen = HostileSourceForTests("first_connection_only", SECRET, payload)
    cfg = make_config(transport="tcp", relay=False, connect_timeout_s=LONG, request_timeout_s=LONG)
    try:
        with WeightPuller([stalling.address, frozen.address], cfg) as puller:
            handle = puller.prepare(1).start()
            assert frozen.holding.wait(SHORT)  # a stream's handshake there is never answered
            stats = handle.stats()
            assert {s["address"] for s in stats["sources"]} == {stalling.address, frozen.address}
            # stats() did not wait for that handshake to give up (at its 30 s deadline).
            assert not frozen.hold_ended.wait(1.0)
            handle.cancel()
    finally:
        stalling.close()
        frozen.close()


def test_a_source_that_accepts_and_never_answers_is_left_out_of_resolving(publisher):
    tensors = random_tensors(9)
    publisher.publish(1, tensors)
    # The kernel accepts connections to a listening socket; nobody ever speaks on them.
    with socket.create_server(("127.0.0.1", 0)) as frozen:
        frozen_address = f"127.0.0.1:{frozen.getsockname()[1]}"
        cfg = make_config(connect_timeout_s=LONG, request_timeout_s=LONG, resolve_timeout_s=0.5)
        with WeightPuller([publisher.address, frozen_address], cfg) as puller:
            handle = puller.prepare(1)
            pulled = handle.start().wait(LONG)
            assert_same(pulled, tensors)
            [skipped] = pulled.stats["skipped_sources"]
            assert skipped.startswith(frozen_address) and "did not answer within 0.5 s" in skipped
            assert list(_by_address(pulled)) == [publisher.address]
            with pytest.raises(TransferTimeout, match=f"no source answered: {frozen_address}: did not answer"):
                puller.prepare(1, sources=[frozen_address])
