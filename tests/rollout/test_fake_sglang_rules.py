"""The SGLang stand-in keeps the rules of the release line it plays, as SGLang's source has
them: aborts by rid prefix, flush refused until the scheduler is idle, the weight-update
session from 0.5.21, and no pause or abort call on Engine."""

import asyncio

import pytest
import torch
from fake_sglang import FAKES

PARAMS = {"max_new_tokens": 400, "temperature": 1.0}


@pytest.fixture(params=sorted(FAKES))
def fake(request, tiny_ckpt):
    made = FAKES[request.param](model_path=str(tiny_ckpt), skip_tokenizer_init=True)
    yield made
    made.shutdown()
    made.loop.run_until_complete(asyncio.sleep(0))
    made.loop.close()
    asyncio.set_event_loop(None)


def _run(fake, coro):
    return fake.loop.run_until_complete(coro)


async def _started(fake, rid: str):
    stream = await fake.async_generate(input_ids=[1, 2, 3], sampling_params=PARAMS, return_logprob=True,
                                       stream=True, rid=rid)
    await stream.__anext__()  # registered, queued, and decoding
    return stream


async def _last(stream) -> dict:
    chunks = [chunk async for chunk in stream]
    return chunks[-1]["meta_info"]["finish_reason"]


def test_an_abort_reaches_every_request_whose_rid_starts_with_it(fake):
    one, ten, two = (_run(fake, _started(fake, rid)) for rid in ("r-1", "r-10", "r-2"))
    fake.tokenizer_manager.abort_request(rid="r-1")
    assert _run(fake, _last(one))["type"] == "abort"
    assert _run(fake, _last(ten))["type"] == "abort"  # as SGLang's scheduler does
    assert "r-2" not in fake.finished
    fake.tokenizer_manager.abort_request(rid="r-2")
    assert _run(fake, _last(two))["type"] == "abort"


def test_an_abort_for_an_unregistered_rid_is_dropped(fake):
    fake.tokenizer_manager.abort_request(rid="r-1")  # before the stream was iterated
    stream = _run(fake, _started(fake, "r-1"))
    assert "r-1" not in fake.finished
    fake.tokenizer_manager.abort_request(rid="r-1")
    assert _run(fake, _last(stream))["type"] == "abort"


def test_flush_is_refused_until_an_aborted_request_has_drained(fake):
    stream = _run(fake, _started(fake, "r-1"))
    fake.tokenizer_manager.abort_request(rid="r-1")
    assert not fake.flush_cache().success  # the scheduler has not processed the abort yet
    _run(fake, _last(stream))
    for _ in range(1000):
        if fake.flush_cache().success:
            break
        _run(fake, asyncio.sleep(0.001))
    assert [ok for name, ok in fake.events if name == "flush_cache"][-1] is True


def test_a_queued_request_blocks_the_flush_from_0_5_20(fake):
    from fake_sglang import _Req

    fake._enqueue(_Req(rid="q", input_ids=[1, 2], params={"max_new_tokens": 2}))  # queued, not yet run
    assert fake.idle() is (not fake.rules.flush_counts_queued)
    for _ in range(1000):
        if fake.idle():
            break
        _run(fake, asyncio.sleep(0.001))
    assert fake.idle()


def test_weight_updates_need_a_session_from_0_5_21(fake):
    bucket = [("model.norm.weight", torch.ones(fake._shapes["model.norm.weight"]))]
    session = fake.rules.weight_update_session
    assert hasattr(fake, "begin_weight_update") is session and hasattr(fake, "end_weight_update") is session
    ok, message = fake.update_weights_from_tensor(bucket, flush_cache=False)
    assert ok is not session
    if not session:
        return
    assert "between begin_weight_update() and end_weight_update()" in message
    assert fake.begin_weight_update() == (True, "Success")
    assert fake.begin_weight_update()[0] is False  # one session at a time
    assert fake.update_weights_from_tensor(bucket, flush_cache=False)[0] is True
    assert fake.end_weight_update() == (True, "Success")
    assert fake.end_weight_update()[0] is False


def test_engine_offers_no_pause_or_abort(fake):
    for name in ("pause_generation", "continue_generation", "abort_request"):
        assert not hasattr(fake, name)
