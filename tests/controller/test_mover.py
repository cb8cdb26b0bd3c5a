"""SampleMover over a fake engine table: what a take-back, a send and the end of a step do to
samples, and what they return (finished samples, lost instances) instead of calling back."""

import asyncio

from table_fakes import FakeScene

from rlboost.controller.config import ControllerConfig
from rlboost.controller.intake import Intake
from rlboost.controller.mover import SampleMover
from rlboost.controller.registry import GONE
from rlboost.sim import make_groups

GROUPS = make_groups(0, num_groups=1, group_size=3, prompt_len=4, max_new_tokens=50)
A, B, C = GROUPS[0].sample_ids


def mover(scene: FakeScene) -> SampleMover:
    intake = Intake(scene.clock, table=scene.table, registry=scene.registry, router=scene.router)
    return SampleMover(ControllerConfig(), scene.clock, table=scene.table, registry=scene.registry,
                       router=scene.router, intake=intake)


def test_take_back_returns_unfinished_samples_with_their_tokens_and_reports_finished_ones():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    for sid in (A, B):
        scene.router.assign(sid, "spot-0")
    spot.exports = {A: scene.state(A, 3), B: scene.state(B, 2, "stop")}

    out = asyncio.run(mover(scene).take_back(scene.step, "spot-0", [A, B]))

    assert out.moved == [A] and out.finished == [B] and out.lost == []
    col = scene.step.collector
    assert col.state_of(A, 0).output_ids == (10, 11, 12)  # it resumes from the exact token where it stopped
    assert col.finished(B)
    assert scene.router.owner(A) is None and scene.router.owner(B) is None  # the caller decides where A goes
    assert scene.router.samples_on("spot-0") == ()
    assert scene.step.meter.migrations == 1


def test_an_instance_whose_export_fails_comes_back_as_lost_with_its_samples_queued():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    scene.router.begin_step([C])  # only C waits in the queue
    for sid in (A, B):
        scene.router.assign(sid, "spot-0")
    spot.failing = {"export"}

    out = asyncio.run(mover(scene).take_back(scene.step, "spot-0", [A, B]))

    assert out.moved == [] and [(x.instance_id, x.samples) for x in out.lost] == [("spot-0", (A, B))]
    assert scene.registry.get("spot-0").state == GONE and "spot-0" not in scene.table
    assert set(scene.router.queued) == {A, B, C}
    assert scene.router.failures[A] == 1  # a lost instance spends the samples' retry budget


def test_send_starts_samples_from_their_collected_tokens():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    scene.collect(A, 5)

    out = asyncio.run(mover(scene).send(scene.step, "spot-0", [A, B]))

    assert out.lost == [] and out.finished == []
    assert [s.output_ids for s in spot.submitted] == [(10, 11, 12, 13, 14), ()]
    assert scene.router.samples_on("spot-0") == (A, B)
    assert scene.step.meter.reprefill_tokens == 4 + 5  # A's prompt and tokens are fed again; B is new


def test_a_refused_batch_is_tried_sample_by_sample_and_only_the_refused_sample_is_kept_from_it():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    spot.refuse = {B}

    out = asyncio.run(mover(scene).send(scene.step, "spot-0", [A, B]))

    assert out.lost == []  # a refusal is not a loss
    assert [c for c in spot.calls if c[0] == "submit"] == [("submit", (A, B)), ("submit", (A,)), ("submit", (B,))]
    assert scene.router.owner(A) == "spot-0"
    assert "spot-0" in scene.router.refusals(B) and B in scene.router.queued
    assert scene.router.failures[B] == 0


def test_a_failed_submit_loses_the_instance_and_the_outcome_says_so():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    spot.failing = {"submit"}

    out = asyncio.run(mover(scene).send(scene.step, "spot-0", [A]))

    assert [x.instance_id for x in out.lost] == ["spot-0"] and scene.table.losses == out.lost
    assert A in scene.router.queued and scene.router.owner(A) is None


def test_send_to_an_instance_that_is_gone_queues_the_samples_again_and_calls_no_engine():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    scene.registry.mark_gone("spot-0", "test")
    scene.router.begin_step([])

    out = asyncio.run(mover(scene).send(scene.step, "spot-0", [A, B]))

    assert out.lost == [] and spot.calls == []
    assert set(scene.router.queued) == {A, B}


def test_quiesce_aborts_what_still_runs_and_releases_held_pages():
    scene = FakeScene(GROUPS)
    spot0, spot1 = scene.add("spot-0"), scene.add("spot-1")
    scene.router.assign(A, "spot-0")
    scene.table.hold([B], "spot-1", object())

    out = asyncio.run(mover(scene).quiesce(scene.step))

    assert out.lost == []
    assert ("abort", (A,)) in spot0.calls and ("release", (B,)) in spot1.calls
    assert scene.router.owner(A) is None and not scene.table.holds(B)


def test_the_reference_continuation_resumes_a_group_from_its_shortest_member_finished_ones_included():
    scene = FakeScene(GROUPS)
    spot = scene.add("spot-0")
    scene.collect(A, 9)
    scene.collect(B, 2, "stop")  # finished early: the published continuation resumes the group from here
    scene.collect(C, 6)
    intake = Intake(scene.clock, table=scene.table, registry=scene.registry, router=scene.router)
    ref = SampleMover(ControllerConfig(continuation="trim_group"), scene.clock, table=scene.table,
                      registry=scene.registry, router=scene.router, intake=intake)

    asyncio.run(ref.send(scene.step, "spot-0", [A, C]))

    assert [s.output_ids for s in spot.submitted] == [(10, 11), (10, 11)]
    col = scene.step.collector
    assert col.progress(A) == col.progress(C) == 2 and col.tokens == 2 + 2 + 2
    assert scene.step.meter.trimmed_tokens == 7 + 4
    # rlboost's own continuation keeps every token
    scene2 = FakeScene(GROUPS)
    spot2 = scene2.add("spot-0")
    scene2.collect(A, 9)
    scene2.collect(B, 2, "stop")
    asyncio.run(mover(scene2).send(scene2.step, "spot-0", [A]))
    assert [len(s.output_ids) for s in spot2.submitted] == [9] and scene2.step.meter.trimmed_tokens == 0
