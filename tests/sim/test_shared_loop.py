"""One schedule (fixed arrivals, a preemption with notice, one without) through the controller
as a run uses it (RolloutService over emulated engines, on virtual time) and through the
simulator (SimController over simulated schedules): the same placements, migrations, drains
and micro-batch releases, at the same times, because both run the controller's own round."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rlboost.controller.adapters import InProcessEngine
from rlboost.controller.clock import ManualClock, run_virtual
from rlboost.controller.records import InstanceInfo
from rlboost.controller.service import RolloutService
from rlboost.recipes.paper_qwen3_8b import paper_qwen3_8b
from rlboost.rollout.emulated.engine import EmulatedEngine
from rlboost.rollout.emulated.pace import pace_of
from rlboost.rollout.emulated.schedule import BatchSchedule
from rlboost.sim.collector import SimCollector
from rlboost.sim.controller import SimController
from rlboost.sim.nodes import SimNode, SimTable
from rlboost.sim.spec import SimSpec
from rlboost.sim.workload import as_sim_groups, make_groups

GROUP_SIZE, PROMPT = 4, 64
INSTANCES = (("reserved-0", "reserved"), ("spot-0", "preemptible"), ("spot-1", "preemptible"),
             ("spot-2", "preemptible"))
WINDOW_S = 1.003  # the local window closes at the first round after this (the test's fixed policy)
NOTICE = ("spot-2", 1.217, 1.2)  # instance, seconds into the step, grace: it drains at 1.217 + 1.2 - margin
KILL = ("spot-1", 2.521)  # killed without notice


class FixedWindowForTests:
    """A window policy that closes the local window WINDOW_S into every step (no rates read)."""

    def plan(self, ctx) -> float:
        return WINDOW_S

    def should_close(self, ctx) -> bool:
        return ctx.elapsed_s >= WINDOW_S

    def observe(self, obs) -> None:
        pass


class RecordingMoverForTests:
    """Wraps the round's Mover and logs each move: (time, what, instance, sample ids)."""

    def __init__(self, inner, clock, log: list):
        self.inner, self.clock, self.log = inner, clock, log

    def _note(self, what, iid, sids):
        self.log.append((round(self.clock.now(), 6), what, iid, tuple(sorted(sids))))

    async def evacuate(self, st, iid):
        out = await self.inner.evacuate(st, iid)
        self._note("evacuate", iid, out.moved)
        return out

    async def take_back(self, st, iid, sids):
        out = await self.inner.take_back(st, iid, sids)
        self._note("take_back", iid, out.moved)
        return out

    async def send(self, st, iid, sids):
        self._note("send", iid, sids)
        return await self.inner.send(st, iid, sids)

    async def retire(self, st, iid):
        self._note("retire", iid, ())
        return await self.inner.retire(st, iid)


def _config(groups: int, max_new: int, published: bool, **modes):
    """The paper recipe's engines and controller at a small step; published: the published
    scheduler (groups round robin, no steals, no routing to a draining instance); modes:
    the controller's seeding and migration."""
    c = paper_qwen3_8b()
    ctl = dataclasses.replace(c.controller, microbatch_min_samples=GROUP_SIZE, **modes)
    if published:
        ctl = dataclasses.replace(
            ctl, router=dataclasses.replace(ctl.router, dispatch="group_round_robin", max_moves_per_tick=0),
            registry=dataclasses.replace(ctl.registry, route_to_draining=False))
    task = dataclasses.replace(c.task, groups_per_step=groups, group_size=GROUP_SIZE, max_new_tokens=max_new)
    return dataclasses.replace(c, controller=ctl, task=task)


def _groups(config):
    t = config.task
    return make_groups(1, num_groups=t.groups_per_step, group_size=t.group_size, prompt_len=PROMPT,
                       max_new_tokens=t.max_new_tokens, seed=config.run.seed)


def _speed(config, kind: str) -> float:
    return config.rollout.emulated.preemptible_speed if kind == "preemptible" else 1.0


def _live(config):
    """The schedule through RolloutService over emulated engines: (moves, releases, metrics)."""
    moves, releases = [], []
    emu, cfg = config.rollout.emulated, config.controller

    async def events(svc, clock):
        iid, at, grace = NOTICE
        await clock.asleep(at - clock.now())
        svc.notice(iid, grace)
        iid, at = KILL
        await clock.asleep(at - clock.now())
        await svc.end(iid, "death", reason="killed without notice")

    async def main(clock):
        svc = RolloutService(cfg, clock=clock, window_policy=FixedWindowForTests())
        svc.round.mover = RecordingMoverForTests(svc.round.mover, clock, moves)
        for iid, kind in INSTANCES:
            engine = EmulatedEngine(emu, clock=clock, kind=kind, speed=_speed(config, kind))
            engine.load_weights({}, 0)
            svc.register(InstanceInfo(instance_id=iid, kind=kind, capacity=config.rollout.capacity), InProcessEngine(engine))
        await svc.start()  # its first round runs once this task waits: after start_step
        svc.start_step(1, _groups(config), 0)
        driver = asyncio.get_running_loop().create_task(events(svc, clock))
        while not await svc.wait_window_closed(60.0):
            pass
        while True:
            mb = await svc.next_microbatch(60.0)
            if mb is None:
                continue
            releases.append((round(clock.now(), 6), tuple(g.group_id for g in mb.groups)))
            if mb.last:
                break
        metrics = await svc.end_step()
        await driver
        await svc.close()
        return metrics

    return moves, releases, run_virtual(main)


def _simulated(config):
    """The same schedule through SimController: (moves, releases, metrics)."""
    moves, releases = [], []
    spec = SimSpec.of(config, prompt_tokens=PROMPT, steps=1)
    emu = spec.rollout.emulated
    clock = ManualClock()
    table = SimTable(spec.controller)
    ctl = SimController(spec, clock, table, policy=FixedWindowForTests())
    ctl.round.mover = RecordingMoverForTests(ctl.round.mover, clock, moves)
    for iid, kind in INSTANCES:
        table.nodes[iid] = node = SimNode(instance_id=iid, kind=kind, schedule=BatchSchedule(
            pace_of(emu, kind), emu.max_running, now=0.0, speed=_speed(config, kind),
            rate_window_s=emu.rate_window_s, kv_capacity=emu.kv_capacity(kind)))
        ctl.register(node)
        ctl.pulled(node, 0)
    col = SimCollector(as_sim_groups(_groups(config), emu), min_samples=spec.microbatch_min_samples,
                       max_samples=spec.controller.microbatch_max_samples)
    ctl.start_step(1, col)
    pending = [(NOTICE[1], lambda: ctl.notice(NOTICE[0], NOTICE[2])),
               (KILL[1], lambda: ctl.lose(KILL[0], "killed without notice"))]
    t, last = 0.0, False
    while not last:
        while pending and pending[0][0] <= t:
            at, apply = pending.pop(0)
            clock.advance(at - clock.now())
            apply()
        clock.advance(t - clock.now())
        ctl.tick()
        st = ctl.st
        if not st.window_open or col.all_done:
            st.handed_over = True
            while not last and (mb := col.take()) is not None:
                releases.append((round(t, 6), tuple(g for g, _ in mb.groups)))
                last = mb.last
        t += spec.controller.poll_interval_s
    return moves, releases, ctl.end_step()


@pytest.mark.parametrize("groups,max_new,published,modes", [
    (6, 384, True, {}), (16, 1024, False, {}), (24, 1024, False, {}),
    (16, 1024, False, {"seeding": False, "migration": "recompute"})])
def test_the_simulator_and_the_live_controller_decide_the_same(groups, max_new, published, modes):
    config = _config(groups, max_new, published, **modes)
    live_moves, live_releases, live = _live(config)
    sim_moves, sim_releases, sim = _simulated(config)
    kinds = {what for _, what, _, _ in live_moves}
    assert {"send", "evacuate", "retire"} <= kinds  # placement, the window's close and the drain
    assert any(what == "evacuate" and iid == "reserved-0" for _, what, iid, _ in live_moves)
    assert any(what == "evacuate" and iid == NOTICE[0] for _, what, iid, _ in live_moves)
    assert sim_moves == live_moves
    assert len(live_releases) > 1 and sim_releases == live_releases
    for m in (live, sim):
        assert (m.preemptions, m.deaths) == (1, 1)
        assert m.resumes > 0
    assert sim.total_tokens == live.total_tokens
    fields = ("window_s", "rollout_time_s", "resumes", "migrations", "migrated_tokens", "reprefill_tokens",
              "trimmed_tokens", "tokens_per_instance", "num_preemptible", "preempted_samples",
              "preempted_reprefill_tokens", "preempted_regenerated_tokens")
    assert [getattr(sim, f) for f in fields] == [getattr(live, f) for f in fields]
    assert (live.trimmed_tokens > 0) == bool(modes)  # without seeding and with recompute, moves restart
    # what the notice and the death cost, apart from the window's handover: resumed, or restarted
    assert live.preempted_samples > 0
    assert (live.preempted_regenerated_tokens > 0, live.preempted_reprefill_tokens > 0) == (bool(modes), not modes)
    assert live.preempted_reprefill_tokens < live.reprefill_tokens or modes  # the handover's are not counted
