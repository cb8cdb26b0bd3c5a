"""Handoff between embedded engines through the sender and receiver the rollout instances
use: samples moved tokens-only or with their KV pages continue exactly as an uninterrupted
run, the result record counts what moved, and a refused or failed handoff loses nothing."""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading

import pytest
import torch
from engine_contract import Collected, collect, make_state, poll_until
from handoff_helpers import Handoff, migrate

from rlboost.errors import HandoffFailed, PeerLost, ProtocolError, RolloutError, TransferTimeout
from rlboost.migration.receiver import SampleReceiver
from rlboost.migration.sender import SampleSender
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.transfer import TransferConfig

MAX_NEW = 40


def states(v: int = 0, n: int = 3):
    return [make_state(i, v, prompt_len=4 + 5 * i, max_new=MAX_NEW, temperature=0.9) for i in range(n)]


@pytest.fixture
def make(tiny_ckpt):
    made = []

    def make(**overrides):
        cfg = dict(model_dir=str(tiny_ckpt), stream_interval=1)
        made.append(EmbeddedEngine(EmbeddedEngineConfig(**{**cfg, **overrides})))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


@pytest.fixture(scope="module")
def reference(tiny_ckpt):
    with EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), stream_interval=8)) as engine:
        engine.submit(states())
        return collect(engine, [0, 1, 2])


def started(engine, at_least: int = 3) -> dict[int, Collected]:
    """Submit the samples and poll until each has streamed a few tokens."""
    engine.submit(states())
    out: dict[int, Collected] = {}
    poll_until(engine, out, lambda o: all(len(o.get(i, Collected()).ids) >= at_least for i in range(3)))
    return out


def reset(out: dict[int, Collected], moved) -> None:
    """A collector takes the drained states as the truth for moved samples."""
    for s in moved:
        assert list(s.output_ids[:len(out[s.sample_id].ids)]) == out[s.sample_id].ids
        out[s.sample_id] = Collected(ids=list(s.output_ids), logprobs=list(s.output_logprobs))


def assert_matches(out: dict[int, Collected], reference) -> None:
    for sid, ref in reference.items():
        assert out[sid].ids == ref.ids, f"sample {sid} diverged"
        assert out[sid].logprobs == pytest.approx(ref.logprobs, abs=1e-5)
        assert out[sid].finish == ref.finish


@pytest.mark.parametrize("mode", ["tokens", "kv"])
def test_moved_samples_continue_as_if_never_moved(make, reference, mode):
    src, dst = make(), make(block_size=8)  # pages cross block sizes too
    out = started(src)
    result = migrate(src, dst, [0, 1, 2, 404], mode=mode)
    assert result.sample_ids == (0, 1, 2)
    reset(out, result.states)
    assert src.poll(0.0) == [] and src.load().running + src.load().queued == 0
    collect(dst, [0, 1, 2], out)
    assert_matches(out, reference)


@pytest.mark.parametrize("mode", ["tokens", "kv"])
def test_result_counts_what_moved(make, mode):
    src, dst = make(), make()
    started(src)
    result = Handoff(src, dst, [2, 0, 404], mode).prepare().start().wait(timeout=60)
    moved = result.states
    assert [s.sample_id for s in moved] == [2, 0]
    assert (result.mode, result.samples_moved) == (mode, 2)
    assert result.tokens_moved == sum(s.position for s in moved)
    if mode == "kv":  # decoding samples have K/V for every token but the last sampled one
        assert result.kv_bytes == sum(s.position - 1 for s in moved) * src.kv_layout.token_bytes
        assert result.reprefill_tokens == 0
    else:
        assert result.kv_bytes == 0
        assert result.reprefill_tokens == sum(s.position - 1 for s in moved)
    assert result.batch_bytes > result.kv_bytes
    phases = (result.drain_s, result.pack_s, result.ship_s, result.unpack_s, result.resume_s)
    assert all(p >= 0 for p in phases) and result.total_s == pytest.approx(sum(phases))
    empty = migrate(src, dst, [2, 404], mode=mode)  # already gone from the source
    assert (empty.samples_moved, empty.tokens_moved, empty.kv_bytes, empty.batch_bytes) == (0, 0, 0, 0)


@pytest.mark.parametrize("mode", ["tokens", "kv"])
def test_several_hops(make, reference, mode):
    engines = [make(), make(block_size=8, num_blocks=64, max_batch_size=2)]
    out = started(engines[0], at_least=1)
    home = 0
    for hop in range(4):
        poll_until(engines[home], out, lambda o, k=hop: all(
            o[i].finish is not None or len(o[i].ids) >= 5 * (k + 1) for i in range(3)))
        live = [i for i in range(3) if out[i].finish is None]
        result = migrate(engines[home], engines[1 - home], live, mode=mode)
        reset(out, result.states)
        home = 1 - home
    collect(engines[home], [i for i in range(3) if out[i].finish is None], out)
    assert_matches(out, reference)


@pytest.mark.parametrize("mode", ["tokens", "kv"])
def test_refused_samples_go_back_to_the_source(make, reference, mode):
    src, dst = make(), make(weight_version=5)  # the destination refuses version-0 samples
    out = started(src)
    with pytest.raises(HandoffFailed) as info:
        migrate(src, dst, [0, 1, 2], mode=mode)
    assert info.value.returned_to_source
    assert isinstance(info.value.__cause__, RolloutError)
    reset(out, info.value.batch.states)
    assert dst.load().running + dst.load().queued == 0
    collect(src, [0, 1, 2], out)
    assert_matches(out, reference)


def test_refused_samples_can_stay_with_the_caller(make, reference):
    src, dst, spare = make(), make(weight_version=5), make()
    out = started(src)
    with pytest.raises(HandoffFailed) as info:
        migrate(src, dst, [0, 1, 2], mode="kv", on_refused="raise")
    batch = info.value.batch
    assert not info.value.returned_to_source and batch.has_kv
    assert src.load().running + src.load().queued == 0
    reset(out, batch.states)
    spare.import_states(batch)
    collect(spare, [0, 1, 2], out)
    assert_matches(out, reference)


def test_kv_layout_mismatch_is_refused_before_anything_moves(make):
    src, dst = make(), make(dtype="bfloat16")
    started(src)
    handoff = Handoff(src, dst, [0, 1, 2], "kv")
    with pytest.raises(RolloutError, match="dtype"):
        handoff.prepare()
    assert src.load().running + src.load().queued == 3
    assert migrate(src, dst, [0], mode="tokens").samples_moved == 1  # tokens still move


class GatedShipmentForTests:
    """Lets a served batch be pulled only once `gate` is set; fails the shipment instead when
    `error` is set."""

    def __init__(self, error: Exception | None = None):
        self.gate = threading.Event()
        self.error = error

    def __call__(self, ticket):
        if self.error is not None:
            raise self.error
        assert self.gate.wait(60)


def test_wait_times_out_and_the_handoff_keeps_going(make, reference):
    src, dst = make(), make()
    out = started(src)
    shipment = GatedShipmentForTests()
    handoff = Handoff(src, dst, [0, 1, 2], "kv", between=shipment).prepare().start()
    with pytest.raises(TransferTimeout):
        handoff.wait(timeout=0.05)
    assert not handoff.done
    shipment.gate.set()
    result = handoff.wait(timeout=60)
    reset(out, result.states)
    collect(dst, [0, 1, 2], out)
    assert_matches(out, reference)


def test_lost_shipment_resumes_on_the_source(make, reference):
    src, dst = make(), make()
    out = started(src)
    with pytest.raises(HandoffFailed) as info:
        Handoff(src, dst, [0, 1, 2], "kv", between=GatedShipmentForTests(PeerLost("link down"))).wait(timeout=60)
    assert info.value.returned_to_source and isinstance(info.value.__cause__, PeerLost)
    reset(out, info.value.batch.states)
    collect(src, [0, 1, 2], out)
    assert_matches(out, reference)


def test_bad_arguments_are_refused(make):
    src, dst = make(), make()
    with pytest.raises(ValueError, match="mode"):
        Handoff(src, dst, [0], "pages")
    with pytest.raises(ValueError, match="on_refused"):
        Handoff(src, dst, [0], "kv", on_refused="drop")
    with pytest.raises(ValueError, match="same engine"):
        Handoff(src, src, [0], "kv")


def test_a_batch_is_served_only_until_its_destination_has_it(make, reference):
    src, dst = make(), make()
    out = started(src)
    with SampleSender() as sender, SampleReceiver() as receiver:
        ticket = sender.send(src, [0, 1, 2], mode="kv")
        result = receiver.receive(dst, ticket)
        assert sender.server.keys() == [ticket.key]
        sender.release(ticket)
        assert sender.server.keys() == []
    reset(out, result.states)
    collect(dst, [0, 1, 2], out)
    assert_matches(out, reference)


def test_a_ticket_that_does_not_match_its_payload_loses_nothing(make, reference):
    src, dst = make(), make()
    out = started(src)
    with SampleSender() as sender, SampleReceiver() as receiver:
        ticket = sender.send(src, [0, 1, 2], mode="kv")
        for wrong in (ticket.nbytes + 1, ticket.nbytes - 1):
            with pytest.raises((ProtocolError, ValueError)):
                receiver.receive(dst, dataclasses.replace(ticket, nbytes=wrong), timeout=30)
        assert dst.load().running + dst.load().queued == 0
        with pytest.raises(ValueError, match="mode"):
            dataclasses.replace(ticket, mode="pages")
        back = sender.take_back(src, ticket)
    reset(out, back.states)
    collect(src, [0, 1, 2], out)
    assert_matches(out, reference)


SECRET = b"handoff-test-secret"  # shared by the source and the destination process


def destination_process(ckpt: str, weight_version: int, tickets, results) -> None:
    """A destination engine in its own process: receive one ticket, run its samples out."""
    torch.set_num_threads(1)
    config = EmbeddedEngineConfig(model_dir=ckpt, stream_interval=1, weight_version=weight_version)
    try:
        with EmbeddedEngine(config) as dst, SampleReceiver(TransferConfig(secret=SECRET, relay=False)) as receiver:
            ticket = tickets.get(timeout=120)
            try:
                result = receiver.receive(dst, ticket, timeout=60)
            except HandoffFailed as exc:
                results.put(("refused", exc.batch.sample_ids))
                return
            out = {s.sample_id: Collected(ids=list(s.output_ids), logprobs=list(s.output_logprobs))
                   for s in result.states}
            collect(dst, result.sample_ids, out)
            results.put(("done", result, out))
    except BaseException as exc:  # reported, so the test fails at once with the reason
        results.put(("error", repr(exc)))
        raise


@pytest.fixture
def destination(tiny_ckpt):
    """Start destination_process(weight_version); yields (tickets, results) queues."""
    ctx = multiprocessing.get_context("spawn")
    procs = []

    def start(weight_version: int = 0):
        tickets, results = ctx.Queue(), ctx.Queue()
        procs.append(ctx.Process(target=destination_process, args=(str(tiny_ckpt), weight_version, tickets,
                                                                   results), daemon=True))
        procs[-1].start()
        return tickets, results

    yield start
    for proc in procs:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


@pytest.mark.parametrize("mode", ["tokens", "kv"])
def test_samples_move_to_another_process(make, reference, destination, mode):
    tickets, results = destination()
    src = make()
    out = started(src)
    with SampleSender(TransferConfig(secret=SECRET)) as sender:
        ticket = sender.send(src, [0, 1, 2, 404], mode=mode)
        assert ticket.sample_ids == (0, 1, 2) and src.load().running + src.load().queued == 0
        tickets.put(ticket)
        status, result, there = results.get(timeout=120)
        assert status == "done" and result.sample_ids == (0, 1, 2) and result.batch_bytes == ticket.nbytes
        assert (result.kv_bytes > 0) == (mode == "kv")
        sender.release(ticket)
        assert ticket.key not in sender.server.keys()
    reset(out, result.states)  # what the source streamed before the move is a prefix of the states
    assert_matches(there, reference)


def test_samples_refused_by_another_process_come_back(make, reference, destination):
    tickets, results = destination(weight_version=5)
    src = make()
    out = started(src)
    with SampleSender(TransferConfig(secret=SECRET)) as sender:
        ticket = sender.send(src, [0, 1, 2], mode="kv")
        tickets.put(ticket)
        assert results.get(timeout=120) == ("refused", (0, 1, 2))
        back = sender.take_back(src, ticket)
        assert ticket.key not in sender.server.keys()
    reset(out, back.states)
    collect(src, [0, 1, 2], out)
    assert_matches(out, reference)


def test_a_stalled_channel_times_out_and_the_samples_go_back(make, reference):
    from rlboost.transfer import ServerConfig, TransferConfig

    src, dst = make(), make()
    out = started(src)
    # a sender capped at 1 KiB/s needs minutes for these pages: the handoff must not wait for it
    slow = TransferConfig(relay=False, handoff=ServerConfig(egress_bytes_per_s=1024), request_timeout_s=2.0)
    with pytest.raises(HandoffFailed) as info:
        migrate(src, dst, [0, 1, 2], mode="kv", config=slow, ship_timeout_s=0.5)
    assert info.value.returned_to_source and isinstance(info.value.__cause__, TransferTimeout)
    assert dst.load().running + dst.load().queued == 0
    reset(out, info.value.batch.states)
    collect(src, [0, 1, 2], out)
    assert_matches(out, reference)


def test_a_full_sender_refuses_before_draining_instead_of_evicting_a_batch(make):
    from rlboost.transfer import ServerConfig, TransferConfig

    src = make()
    src.submit(states(n=3))
    with SampleSender(TransferConfig(handoff=ServerConfig(versions_kept=2))) as sender:
        first, second = sender.send(src, [0], mode="kv"), sender.send(src, [1], mode="kv")
        with pytest.raises(RolloutError, match="versions_kept"):
            sender.send(src, [2], mode="kv")
        assert src.load().running + src.load().queued == 1  # sample 2 was not drained
        assert sorted(sender.server.keys()) == [first.key, second.key]  # nothing evicted
        sender.release(first)
        third = sender.send(src, [2], mode="kv")
        assert sender.pending == 2 and third.sample_ids == (2,)


def test_parts_of_one_ticket_go_to_different_destinations(make, reference):
    src, dst_a, dst_b = make(), make(), make()
    out = started(src)
    with SampleSender() as sender, SampleReceiver() as receiver:
        ticket = sender.send(src, [0, 1, 2], mode="kv")
        reset(out, sender.states(ticket))
        receiver.receive(dst_a, ticket, sample_ids=[0, 2])
        sender.release(ticket, [0, 2])
        assert ticket.key in sender.server.keys()  # sample 1 still waits for a destination
        receiver.receive(dst_b, ticket, sample_ids=[1])
        sender.release(ticket, [1])
        assert ticket.key not in sender.server.keys() and sender.pending == 0
    collect(dst_a, [0, 2], out)
    collect(dst_b, [1], out)
    assert_matches(out, reference)
