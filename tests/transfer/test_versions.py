"""Two versions alive at once: publishing while a slow puller reads never tears it."""

import pytest
import torch

from rlboost.errors import VersionMismatch
from rlboost.transfer import ServerConfig, WeightPublisher, WeightPuller

from .helpers import make_config, wait_for_bytes

NBYTES = 2 << 20


def blobs():
    return (torch.randint(0, 256, (NBYTES,), dtype=torch.uint8) for _ in range(3))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_publishing_v2_during_a_slow_pull_of_v1_keeps_v1_exact(transport):
    v1, v2, v3 = blobs()
    # A capped server serves over TCP only, so the shared-memory pull runs uncapped.
    cap = 2_000_000 if transport == "tcp" else None
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=cap, versions_kept=2))) as pub:
        pub.publish(1, {"blob": v1})
        with WeightPuller(pub.address, make_config(transport=transport)) as puller:
            handle = puller.prepare(1).start()
            if transport == "tcp":
                wait_for_bytes(handle, 256 << 10)
            pub.publish(2, {"blob": v2})
            assert pub.versions == [1, 2]
            assert torch.equal(handle.wait(timeout=60)["blob"], v1)
            pub.publish(3, {"blob": v3})  # v1 retires; its region may now be reused
            assert torch.equal(puller.pull(3, timeout=60)["blob"], v3)


def test_version_retired_mid_pull_raises_version_mismatch_not_torn_bytes():
    v1, v2, _ = blobs()
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=2_000_000, versions_kept=1))) as pub:
        pub.publish(1, {"blob": v1})
        with WeightPuller(pub.address, make_config(transport="tcp")) as puller:
            handle = puller.prepare(1).start()
            wait_for_bytes(handle, 256 << 10)
            pub.publish(2, {"blob": v2})  # keeps one version: v1 stops being served
            with pytest.raises(VersionMismatch):
                handle.wait(timeout=60)
            assert torch.equal(puller.pull(2, timeout=60)["blob"], v2)
