"""BatchSchedule, the timing core the emulated engine and the simulator share: every admitted
sample finishes with the length it was given; the KV cache's capacity holds samples back
and retracts one when decoding fills it, yet everything still finishes; prefill goes in batches."""

from __future__ import annotations

import math

import pytest

from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.rollout.emulated.pace import FixedPace, RooflinePace
from rlboost.rollout.emulated.schedule import BatchSchedule


def _roofline(**kw) -> RooflinePace:
    return RooflinePace(EmulatedEngineConfig(model="qwen3-8b", gpus=2, token_block=64, **kw))


def _run_to_end(s: BatchSchedule, limit: float = 1e6) -> list[int]:
    done = []
    while len(s) and s.t < limit:
        at = s.next_event_at()
        for sid in s.advance(at if at < math.inf else s.t + 1.0):
            done.append(sid)
            s.drop(sid)
    return done


def test_every_sample_finishes_once_with_its_length():
    s = BatchSchedule(_roofline(), max_running=8)
    lengths = {sid: 3 + (sid * 7) % 40 for sid in range(20)}
    for sid, n in lengths.items():
        s.admit(sid, prompt_len=5, base=0, length=n, prefill_s=0.001)
    seen = {}
    while len(s):
        t = s.next_event_at()
        for sid in s.advance(t):
            seen[sid] = s.produced(sid)
            s.drop(sid)
    assert seen == lengths


def test_a_full_cache_holds_samples_back_and_retracts_without_losing_any():
    cap = 1_000.0  # emulated tokens of cache: 30 prompts fit, 40 do not
    s = BatchSchedule(_roofline(), max_running=64, kv_capacity=cap)
    for sid in range(40):
        s.admit(sid, prompt_len=30, base=0, length=150, prefill_s=0.001)
    assert s.running < 40  # admission stopped at the cache's share
    assert sorted(_run_to_end(s)) == list(range(40))
    assert s.retractions > 0


def test_samples_admitted_together_prefill_as_one_batch():
    s = BatchSchedule(FixedPace(EmulatedEngineConfig(prefill_tokens_per_s=100.0)), max_running=8)
    for sid in range(4):
        s.admit(sid, prompt_len=10, base=0, length=5, prefill_s=0.1)
    assert s.next_event_at() == pytest.approx(0.4)  # the batch: four prompts at the fixed rate
    s.advance(0.4)
    assert all(s.phase(sid) == "decode" for sid in range(4))
