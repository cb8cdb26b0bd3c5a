"""A draining instance keeps working through its grace period: it takes the samples that
surely finish before its drain time, refuses the rest, and still hands back whatever is
unfinished when that time comes (the router alone, then the driver loop on virtual time)."""

import dataclasses

import pytest
from controller_fakes import add_instance, outputs, run_step, uninterrupted
from test_service import config, later, scenario, window

from rlboost.controller.estimates import RateModel
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import InstanceView, Router, RouterConfig
from rlboost.sim import make_groups

NO_STOP = dict(stop_probability=1e-12)  # samples run to max_new_tokens: lengths are known


def view(name, capacity, per_sample, aggregate, time_left_s=None):
    return InstanceView(name, capacity, RateModel(per_sample, aggregate), True, None, time_left_s)


def test_an_instance_with_a_deadline_takes_only_samples_whose_whole_budget_fits():
    r = Router(RouterConfig(prefill_tokens_per_s=1000.0))
    r.begin_step([0, 1])
    budget = {0: 50, 1: 500}  # most tokens still to come; 10 tok/s per sample leaves 5 s and 50 s
    draining = view("d", 4, 10.0, 1000.0, time_left_s=10.0)
    assigns = r.dispatch([draining], remaining=lambda s: 1.0, budget=budget.__getitem__, position=lambda s: 100)
    assert [(a.instance_id, a.sample_ids) for a in assigns] == [("d", (0,))]
    assert r.queued == (1,)
    # its load counts: with the priors (10 tok/s alone, 20 tok/s in all) a step of k samples
    # takes max(1/10, 1/40 + k/20) s, so with four each decodes at 4.4 tok/s: 50 tokens, 11 s
    r.begin_step([0, 1, 2])
    crowded = view("d", 4, 10.0, 20.0, time_left_s=10.0)
    r.dispatch([crowded], remaining=lambda s: 1.0, budget=lambda s: 50, position=lambda s: 0)
    assert r.samples_on("d") == (0, 1, 2)  # the third still has 5.7 tok/s: 8.8 s
    r.begin_step([0, 1, 2, 3])
    r.dispatch([crowded], remaining=lambda s: 1.0, budget=lambda s: 50, position=lambda s: 100)
    assert r.samples_on("d") == (0, 1, 2) and r.queued == (3,)  # + re-prefill: past 10 s
    # without a budget nothing is known to fit
    r.begin_step([0])
    assert r.dispatch([draining], remaining=lambda s: 1.0) == [] and r.queued == (0,)


def test_stealing_skips_a_fast_draining_target_nothing_fits_and_uses_the_next_one():
    r = Router(RouterConfig(steal_margin=0.3, min_steal_gain_s=1.0))
    r.begin_step(range(8))
    crowded = view("crowded", 8, 50.0, 100.0)
    r.dispatch([crowded], remaining=lambda s: 500.0)
    fast_draining = view("draining", 4, 50.0, 400.0, time_left_s=3.0)  # 500 tokens need 10 s
    idle = view("idle", 4, 40.0, 400.0)
    moves = r.steal([crowded, fast_draining, idle], remaining=lambda s: 500.0, position=lambda s: 10,
                    budget=lambda s: 500)
    assert moves and all(m.target == "idle" for m in moves)
    # samples that fit go to the faster draining instance
    moves = r.steal([crowded, view("draining", 4, 50.0, 400.0, time_left_s=30.0), idle],
                    remaining=lambda s: 500.0, position=lambda s: 10, budget=lambda s: 500)
    assert moves and moves[0].target == "draining"


def group(group_id, size, max_new_tokens):
    g = make_groups(0, num_groups=1, group_size=size, prompt_len=4, max_new_tokens=max_new_tokens)[0]
    return dataclasses.replace(g, group_id=group_id)


# queued in this order: long samples (30 s at 10 tok/s), short ones (1 s), long ones again
LONG_FIRST, LONG_LAST = group(0, 2, 300), group(9, 2, 300)
SHORT = [group(gid, 2, 10) for gid in range(1, 5)]
GROUPS = [LONG_FIRST, *SHORT, LONG_LAST]
NOTICE_AT, GRACE_S, MARGIN_S = 1.5, 20.0, 2.0
DRAIN_AT = NOTICE_AT + GRACE_S - MARGIN_S


def grace_scenario(route_to_draining):
    cfg = config(registry=RegistryConfig(heartbeat_interval_s=1.0, missed_beats=3, drain_margin_s=MARGIN_S,
                                         route_to_draining=route_to_draining))

    async def body(svc, clock, log):
        add_instance(svc, clock, log, "reserved-0", "reserved", capacity=1, sample_tokens_per_s=10.0, **NO_STOP)
        add_instance(svc, clock, log, "spot-0", capacity=3, sample_tokens_per_s=10.0, **NO_STOP)
        later(clock, NOTICE_AT, lambda: svc.notice("spot-0", GRACE_S))
        return await run_step(svc, clock, 0, GROUPS, 0)
    (batches, metrics), log = scenario(body, cfg=cfg, policy=window(1000.0))  # reserved-0 stays in
    assert outputs(batches) == uninterrupted(GROUPS, **NO_STOP)
    return sample_groups(batches), metrics, log


def sample_groups(batches):
    return {s.sample_id: g.group_id for mb in batches for g in mb.groups for s in g.samples}


def test_a_noticed_instance_finishes_samples_that_fit_its_grace_and_drains_the_rest():
    group_of, metrics, log = grace_scenario(route_to_draining=True)
    spot = [e for e in log if e.instance == "spot-0"]
    late_submits = [e for e in spot if e.method == "submit" and e.t > NOTICE_AT]
    late = {s for e in late_submits for s in e.ids}
    assert late and {group_of[s] for s in late} <= {g.group_id for g in SHORT}  # only samples that fit
    exports = [e for e in spot if e.method == "export"]
    assert exports and all(DRAIN_AT <= e.t < NOTICE_AT + GRACE_S for e in exports)  # no earlier move
    drained = {s for e in exports for s in e.ids}
    assert not late & drained  # what it took after the notice, it finished itself
    assert drained and {group_of[s] for s in drained} == {LONG_FIRST.group_id}  # the safety net
    resumed = [e for e in log if e.method == "submit" and e.t >= DRAIN_AT and set(e.ids) & drained]
    assert resumed and all(e.instance == "reserved-0" for e in resumed)
    assert metrics.preemptions == 1 and metrics.deaths == 0 and metrics.resumes == 0
    assert metrics.migrations == len(drained)


def test_with_route_to_draining_off_a_notice_stops_all_routing_to_the_instance():
    group_of, metrics, log = grace_scenario(route_to_draining=False)
    assert not [e for e in log if e.instance == "spot-0" and e.method == "submit" and e.t > NOTICE_AT]
    exports = [e for e in log if e.instance == "spot-0" and e.method == "export"]
    assert exports and all(DRAIN_AT <= e.t < NOTICE_AT + GRACE_S for e in exports)


def test_route_to_draining_must_be_a_bool():
    with pytest.raises(ValueError, match="route_to_draining"):
        RegistryConfig(route_to_draining="yes")
