"""Intake over a fake engine table: a poll's deltas reach the collector only from the
instance that owns the sample, gaps resume the sample from what was collected, and a failed
poll comes back as a lost instance."""

import asyncio

from table_fakes import FakeScene

from rlboost.controller.intake import Intake
from rlboost.controller.step import Outcome
from rlboost.errors import PeerLost
from rlboost.rollout.engine import TokenDelta
from rlboost.sim import make_groups

GROUPS = make_groups(0, num_groups=1, group_size=2, prompt_len=4, max_new_tokens=50)
A, B = GROUPS[0].sample_ids


def delta(sid, start, n, finish=None):
    return TokenDelta(sample_id=sid, start=start, ids=tuple(range(20, 20 + n)), logprobs=(-0.5,) * n,
                      finish_reason=finish, weight_version=0)


def take(scene: FakeScene, iid: str, result) -> Outcome:
    intake = Intake(scene.clock, table=scene.table, registry=scene.registry, router=scene.router)
    out = Outcome()
    asyncio.run(intake.take_poll(scene.step, iid, result, 1, out))
    return out


def test_deltas_count_only_from_the_owner_and_a_finished_sample_is_reported():
    scene = FakeScene(GROUPS)
    scene.add("spot-0")
    scene.add("spot-1")
    scene.router.assign(A, "spot-0")
    scene.router.assign(B, "spot-1")  # B has moved: spot-0's tokens of it are stale

    out = take(scene, "spot-0", [delta(A, 0, 4, "stop"), delta(B, 0, 7)])

    col = scene.step.collector
    assert out.finished == [A] and out.lost == []
    assert col.progress(A) == 4 and col.finished(A) and col.progress(B) == 0
    assert scene.router.owner(A) is None
    assert dict(scene.step.meter.tokens) == {"spot-0": 4}


def test_a_gap_aborts_the_sample_and_queues_it_to_resume_from_the_collected_tokens():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    scene.router.begin_step([])
    scene.router.assign(A, "spot-0")

    out = take(scene, "spot-0", [delta(A, 0, 2), delta(A, 5, 1)])

    assert out.lost == [] and ("abort", (A,)) in spot.calls
    assert scene.router.queued == (A,) and scene.step.collector.progress(A) == 2
    assert scene.step.meter.resumes == 1


def test_a_failed_poll_comes_back_as_a_lost_instance():
    scene = FakeScene(GROUPS)
    scene.add("spot-0")
    scene.router.assign(A, "spot-0")

    out = take(scene, "spot-0", PeerLost("gone"))

    assert [(x.instance_id, x.samples) for x in out.lost] == [("spot-0", (A,))]
    assert "spot-0" not in scene.table and A in scene.router.queued
