"""An egress-capped server spends its budget only on bytes someone still waits for:
requests whose pullers gave up stop costing tokens, so a later pull is not delayed by
them."""

import threading

import pytest
import torch

from rlboost.errors import TransferError, TransferTimeout
from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import make_config

MiB = 1 << 20


def _give_up(address: str, failures: list) -> None:
    impatient = make_config(transport="tcp", relay=False, keep_connections=False, streams=4,
                            max_in_flight=4, request_timeout_s=0.5, reconnect_attempts=0)
    try:
        with WeightPuller(address, impatient) as puller:
            puller.pull(1)
    except TransferError as e:
        failures.append(e)


def test_requests_abandoned_by_their_pullers_do_not_delay_a_later_pull():
    with WeightPublisher(make_config(chunk_bytes=MiB, publisher=ServerConfig(egress_bytes_per_s=MiB // 2))) as pub:
        pub.publish(1, {"w": torch.zeros(16 * MiB, dtype=torch.uint8)})
        failures: list = []
        threads = [threading.Thread(target=_give_up, args=(pub.address, failures)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(failures) == 3  # 16 MiB at 0.5 MiB/s cannot arrive within 0.5 s
        small = torch.arange(64 << 10, dtype=torch.uint8)
        pub.publish(2, {"w": small})
        cfg = make_config(transport="tcp", relay=False, streams=1, max_in_flight=1, request_timeout_s=60)
        with WeightPuller(pub.address, cfg) as newcomer:
            # 64 KiB take about 0.13 s at the cap; the abandoned requests' ~12 MiB would take 24 s.
            assert torch.equal(newcomer.pull(2, timeout=10)["w"], small)


def test_a_cap_too_low_for_the_deadline_fails_the_pull_with_a_timeout_naming_the_cap():
    # 256 KiB pieces at 1 KiB/s cannot start within a 1 s send deadline: the server says so
    # in a reply (the puller gives up the source at once, with the reason) instead of
    # closing the connection mid-frame, and it keeps serving.
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=1024), request_timeout_s=2.0)) as pub:
        pub.publish(1, {"w": torch.zeros(300_000, dtype=torch.uint8)})
        cfg = make_config(transport="tcp", relay=False, request_timeout_s=2.0)
        with WeightPuller(pub.address, cfg) as puller:
            with pytest.raises(TransferTimeout, match="egress cap"):
                puller.pull(1, timeout=60)
        pub.publish(2, {"w": torch.zeros(16, dtype=torch.uint8)})
        with WeightPuller(pub.address, cfg) as puller:
            assert int(puller.pull(2)["w"].sum()) == 0
