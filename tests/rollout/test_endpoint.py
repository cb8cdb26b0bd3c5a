"""EngineHost with its HandoffEndpoint: an engine plus the handoff protocol a controller
drives; KV pages go from the source's sender to the destination, only tickets and
token-only states come back."""

import pytest
from engine_contract import Collected, collect, make_state, poll_until

from rlboost.errors import HandoffFailed, RolloutError
from rlboost.migration.endpoint import HandoffEndpoint
from rlboost.migration.state import RequestState
from rlboost.rollout.embedded.engine import EmbeddedEngine, EmbeddedEngineConfig
from rlboost.rollout.engine import RolloutEngine
from rlboost.rollout.host import EngineHost


class HostedForTests:
    """An EngineHost called as a controller calls it (engine_call), with its engine's layout."""

    def __init__(self, host: EngineHost):
        self.host, self.engine, self.kv_layout = host, host.engine, host.kv_layout

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.host.engine_call(name, *args, **kwargs)


@pytest.fixture
def make(tiny_ckpt):
    made = []

    def make(**overrides):
        cfg = dict(model_dir=str(tiny_ckpt), stream_interval=1)
        made.append(HostedForTests(EngineHost(lambda: EmbeddedEngine(EmbeddedEngineConfig(**{**cfg, **overrides})),
                                              handoff=True)))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def started(engine, n=3):
    states = [make_state(i, 0, prompt_len=4 + 5 * i, max_new=30, temperature=0.9) for i in range(n)]
    engine.submit(states)
    out = {}
    poll_until(engine, out, lambda o: all(len(o.get(i, Collected()).ids) >= 3 for i in range(n)))
    return states, out


def test_samples_move_with_their_pages_and_continue_exactly(make):
    reference = make()
    _, want = started(reference)
    collect(reference, [0, 1, 2], want)
    src, dst = make(), make(block_size=8)
    assert isinstance(src.engine, RolloutEngine) and src.kv_layout.compatible_with(dst.kv_layout)
    _, out = started(src)
    ticket, moved = src.handoff_send([0, 1, 2, 99])
    assert ticket.sample_ids == (0, 1, 2) and [s.sample_id for s in moved] == [0, 1, 2]
    assert all(isinstance(s, RequestState) for s in moved)  # tokens only: the pages stay with src
    for s in moved:
        out[s.sample_id] = Collected(ids=list(s.output_ids), logprobs=list(s.output_logprobs))
    dst.handoff_receive(ticket, [0, 1, 2])
    src.handoff_release(ticket, [0, 1, 2])
    collect(dst, [0, 1, 2], out)
    for i in range(3):
        assert out[i].ids == want[i].ids


def test_a_refused_ticket_is_taken_back_by_its_source(make, tiny_ckpt):
    src = make()
    other = HostedForTests(EngineHost(EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_ckpt), weight_version=7)),
                                      handoff=True))
    try:
        _, out = started(src)
        ticket, moved = src.handoff_send([0, 1])
        with pytest.raises(HandoffFailed):
            other.handoff_receive(ticket)  # weight version 7: refuses version-0 samples
        src.handoff_take_back(ticket)
        assert src.load().running + src.load().queued == 3
        for s in moved:
            out[s.sample_id] = Collected(ids=list(s.output_ids), logprobs=list(s.output_logprobs))
        collect(src, [0, 1, 2], out)
    finally:
        other.close()


def test_nothing_to_move_gives_no_ticket(make):
    src = make()
    assert src.handoff_send([5, 6]) == (None, ())
    with pytest.raises(ValueError, match="max_pending"):
        HandoffEndpoint(src.engine, max_pending=0)
    with pytest.raises(RolloutError):
        make(max_batch_size=1).handoff_take_back(None)  # nothing was ever sent from it
