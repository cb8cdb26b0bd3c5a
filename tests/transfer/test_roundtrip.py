"""Byte-exact round trips over every built transport, for odd sizes, into fresh or reused
buffers, through publish() and through stage()/commit()."""

import gc

import pytest
import torch

from rlboost.errors import TransferClosed, VersionMismatch
from rlboost.transfer import Manifest, ServerConfig, TqdmProgress, WeightPublisher, WeightPuller

from .helpers import BUILT_TRANSPORTS, CHUNK, assert_same, make_config, random_tensors


@pytest.mark.parametrize("transport", BUILT_TRANSPORTS)
@pytest.mark.parametrize("nbytes", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345])
def test_single_tensor_round_trip(publisher, transport, nbytes):
    blob = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    publisher.publish(1, {"blob": blob})
    with WeightPuller(publisher.address, make_config(transport=transport)) as puller:
        pulled = puller.pull(1)
        assert torch.equal(pulled["blob"], blob)
        assert pulled.version == 1 and pulled.manifest.total_bytes == nbytes
        used = {s["transport"] for s in pulled.stats["sources"]}
        assert used == {transport}


@pytest.mark.parametrize("transport", BUILT_TRANSPORTS)
def test_many_dtypes_round_trip_as_zero_copy_views(publisher, transport):
    tensors = random_tensors()
    manifest = publisher.publish(3, tensors)
    assert len(manifest.chunk_tags) == 16 * -(-manifest.total_bytes // CHUNK)
    with WeightPuller(publisher.address, make_config(transport=transport)) as puller:
        pulled = puller.pull()  # latest
        assert pulled.version == 3
        assert_same(pulled, tensors)
        base = pulled.buffer.data_ptr()
        for spec in pulled.manifest.tensors:
            if spec.nbytes:
                assert pulled[spec.name].data_ptr() == base + spec.offset


def test_auto_picks_shared_memory_for_a_same_host_source(publisher):
    publisher.publish(1, {"w": torch.randn(1000)})
    with WeightPuller(publisher.address, make_config(transport="auto")) as puller:
        assert [s["transport"] for s in puller.pull(1).stats["sources"]] == ["shm"]


def test_capped_server_is_pulled_over_tcp():
    with WeightPublisher(make_config(publisher=ServerConfig(egress_bytes_per_s=50_000_000))) as pub:
        blob = torch.randint(0, 256, (100_000,), dtype=torch.uint8)
        pub.publish(1, {"blob": blob})
        with WeightPuller(pub.address, make_config(transport="auto")) as puller:
            pulled = puller.pull(1)
            assert torch.equal(pulled["blob"], blob)
            assert [s["transport"] for s in pulled.stats["sources"]] == ["tcp"]
        for one_sided in set(BUILT_TRANSPORTS) - {"tcp"}:
            with WeightPuller(pub.address, make_config(transport=one_sided)) as puller:
                with pytest.raises(ValueError, match="capped"):
                    puller.pull(1)


def test_pull_into_preallocated_buffer_and_reuse_it(publisher):
    with WeightPuller(publisher.address, make_config()) as puller:
        first = random_tensors(0)
        publisher.publish(1, first)
        dest = torch.zeros(publisher_total(first) + 1000, dtype=torch.uint8)
        p1 = puller.pull(1, into=dest)
        assert p1.buffer.data_ptr() == dest.data_ptr()
        assert_same(p1, first)
        second = random_tensors(1)
        publisher.publish(2, second)
        p2 = puller.pull(2, into=p1)
        assert p2.buffer.data_ptr() == dest.data_ptr()
        assert_same(p2, second)


def publisher_total(tensors) -> int:
    return Manifest.build(0, tensors, alignment=256).total_bytes


def test_destination_checks(publisher):
    publisher.publish(1, {"w": torch.randn(4096)})
    with WeightPuller(publisher.address, make_config()) as puller:
        with pytest.raises(ValueError, match="into"):
            puller.pull(1, into=torch.zeros(100, dtype=torch.uint8))
        with pytest.raises(ValueError, match="contiguous"):
            puller.pull(1, into=torch.zeros(8192, 4)[:, 0])


def test_stage_and_commit_bucket_by_bucket(publisher):
    tensors = random_tensors(5)
    manifest = Manifest.build(7, tensors, alignment=256)
    views = publisher.stage(7, manifest)
    for name, t in tensors.items():  # as a trainer gathering one bucket at a time would
        views[name].copy_(t)
    committed = publisher.commit(7)
    assert committed.version == 7 and committed.chunk_tags
    with WeightPuller(publisher.address, make_config()) as puller:
        assert_same(puller.pull(7), tensors)


def test_old_versions_retire_and_raise_version_mismatch(config):
    with WeightPublisher(make_config(publisher=ServerConfig(versions_kept=2))) as pub:
        for v in (1, 2, 3):
            pub.publish(v, {"w": torch.full((100,), float(v))})
        assert pub.versions == [2, 3] and pub.latest == 3
        with WeightPuller(pub.address, make_config()) as puller:
            assert puller.latest_version() == 3
            assert puller.pull(2)["w"][0].item() == 2.0
            with pytest.raises(VersionMismatch):
                puller.pull(1)
            with pytest.raises(VersionMismatch):
                puller.pull(99)


def test_progress_callback_and_tqdm_bar(publisher, tmp_path):
    publisher.publish(1, {"w": torch.randn(200_000)})
    seen = []
    with WeightPuller(publisher.address, make_config()) as puller:
        pulled = puller.pull(1, progress=lambda done, total: seen.append((done, total)))
        total = pulled.manifest.total_bytes
        assert seen[-1] == (total, total)
        assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
        with open(tmp_path / "bar.txt", "w") as f:
            puller.pull(1, progress=TqdmProgress(file=f))
        assert "pull weights" in (tmp_path / "bar.txt").read_text()


def test_views_outlive_the_puller_and_the_publisher(config):
    tensors = random_tensors(9)
    with WeightPublisher(config) as pub:
        pub.publish(1, tensors)
        with WeightPuller(pub.address, make_config()) as puller:
            pulled = puller.pull(1)
            view = pulled["model.embed_tokens.weight"]
    del pulled
    gc.collect()
    assert torch.equal(view, tensors["model.embed_tokens.weight"])


def test_closed_objects_raise_transfer_closed(publisher):
    publisher.publish(1, {"w": torch.randn(10)})
    puller = WeightPuller(publisher.address, make_config())
    puller.close()
    with pytest.raises(TransferClosed):
        puller.pull(1)
    publisher.close()
    with pytest.raises(TransferClosed):
        publisher.publish(2, {"w": torch.randn(10)})


@pytest.mark.slow
def test_payload_over_2_gib_round_trips():
    nbytes = (2 << 30) + 4097
    with WeightPublisher(make_config(chunk_bytes=16 << 20)) as pub:
        manifest = Manifest.from_layout(1, [("blob", "uint8", (nbytes,))])
        blob = pub.stage(1, manifest)["blob"]
        head, tail = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8), torch.randint(0, 256, (4097,), dtype=torch.uint8)
        blob[: 1 << 20] = head
        blob[-4097:] = tail
        pub.commit(1)
        with WeightPuller(pub.address, make_config(transport="tcp", chunk_bytes=16 << 20)) as puller:
            got = puller.pull(1)["blob"]
            assert torch.equal(got[: 1 << 20], head) and torch.equal(got[-4097:], tail)
            assert not got[1 << 20: -4097].any()
