"""Concurrent pullers, the prepare/start/wait lifecycle, and a hostile client during a pull."""

import pytest
import torch

from rlboost import _C_testing
from rlboost.errors import ProtocolError, TransferClosed, TransferTimeout
from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import BUILT_TRANSPORTS, make_config, wait_for_bytes
from .wire_client import W, connect, frame, recv_frame


@pytest.mark.parametrize("transport", BUILT_TRANSPORTS)
def test_concurrent_pullers_all_get_exact_bytes(publisher, transport):
    blob = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8)
    publisher.publish(1, {"blob": blob})
    pullers = [WeightPuller(publisher.address, make_config(transport=transport, relay=False)) for _ in range(4)]
    try:
        handles = [p.prepare(1).start() for p in pullers]
        for h in handles:
            assert torch.equal(h.wait(timeout=60)["blob"], blob)
    finally:
        for p in pullers:
            p.close()


def test_hostile_client_during_a_pull_does_not_disturb_it():
    blob = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=1_000_000))) as pub:
        pub.publish(1, {"blob": blob})
        with WeightPuller(pub.address, make_config(transport="tcp")) as puller:
            handle = puller.prepare(1).start()
            wait_for_bytes(handle, 64 << 10)
            with connect(pub.address) as s:
                s.sendall(frame(W["hello"], b"", length=0x7FFFFFFF))
                with pytest.raises(ProtocolError):
                    _C_testing.parse_frame(recv_frame(s))
            assert torch.equal(handle.wait(timeout=60)["blob"], blob)


def test_wait_with_timeout_then_wait_again():
    blob = torch.randint(0, 256, (512 << 10,), dtype=torch.uint8)
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=1_000_000))) as pub:
        pub.publish(1, {"blob": blob})
        with WeightPuller(pub.address, make_config(transport="tcp")) as puller:
            handle = puller.prepare(1)
            assert handle.manifest.total_bytes == blob.numel() and not handle.started
            handle.start()
            with pytest.raises(TransferTimeout):
                handle.wait(timeout=0.01)
            assert torch.equal(handle.wait(timeout=60)["blob"], blob)


def test_cancel_ends_the_pull_with_transfer_closed():
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=200_000))) as pub:
        pub.publish(1, {"blob": torch.zeros(4 << 20, dtype=torch.uint8)})
        with WeightPuller(pub.address, make_config(transport="tcp")) as puller:
            handle = puller.prepare(1).start()
            handle.cancel()
            with pytest.raises(TransferClosed):
                handle.wait(timeout=30)
