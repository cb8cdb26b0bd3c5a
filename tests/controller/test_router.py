"""Router: least outstanding work by measured rate, free slots only, work stealing, retry budgets."""

import pytest

from rlboost.controller.estimates import RateModel
from rlboost.controller.router import InstanceView, Router, RouterConfig


def view(name, capacity, per_sample, aggregate, accepts=True):
    return InstanceView(name, capacity, RateModel(per_sample, aggregate), accepts)


def test_dispatch_fills_free_slots_weighted_by_rate_and_never_overfills():
    r = Router(RouterConfig())
    r.begin_step(range(10))
    fast, slow = view("fast", 6, 100.0, 600.0), view("slow", 6, 100.0, 200.0)
    assigns = r.dispatch([fast, slow], remaining=lambda s: 100.0)
    placed = {a.instance_id: len(a.sample_ids) for a in assigns}
    assert placed["fast"] > placed["slow"] and placed["fast"] <= 6 and placed["slow"] <= 6
    assert sum(placed.values()) == 10 and r.queued == ()
    r.begin_step(range(20))
    r.dispatch([fast, slow], remaining=lambda s: 100.0)
    assert len(r.samples_on("fast")) == 6 and len(r.samples_on("slow")) == 6 and len(r.queued) == 8


def test_draining_instances_get_no_new_samples():
    r = Router(RouterConfig())
    r.begin_step(range(3))
    assert r.dispatch([view("d", 8, 50.0, 400.0, accepts=False)], remaining=lambda s: 10.0) == []
    assert r.queued == (0, 1, 2)


def test_idle_fast_instance_steals_from_a_crowded_one_but_not_for_a_small_gain():
    r = Router(RouterConfig(steal_margin=0.3, min_steal_gain_s=1.0))
    r.begin_step(range(8))
    crowded = view("crowded", 8, 50.0, 100.0)  # 8 samples share 100 tok/s: 12.5 each
    r.dispatch([crowded], remaining=lambda s: 500.0)
    idle = view("idle", 4, 50.0, 400.0)
    moves = r.steal([crowded, idle], remaining=lambda s: 500.0, position=lambda s: 100)
    moved = [s for m in moves for s in m.sample_ids]
    assert moves and all(m.source == "crowded" and m.target == "idle" for m in moves)
    assert 1 <= len(moved) <= 4
    assert set(r.samples_on("crowded")) >= set(moved)  # decisions only: the caller moves them
    # nearly finished samples are not worth a re-prefill
    assert r.steal([crowded, idle], remaining=lambda s: 5.0, position=lambda s: 100) == []


def test_an_emptied_instance_takes_samples_from_a_crowded_twin():
    """Two instances of the same hardware (a decode step takes 1/30 + k/600 s), measured
    with 100 and 20 samples: the one that ran dry decodes a lone sample almost three times
    as fast as its twin decodes forty, so it steals."""
    def measured():
        m = RateModel(30.0, 1000.0)
        for i in range(60):
            k = (100, 20)[i % 2]
            m.observe(tokens=k / (1 / 30 + k / 600), seconds=1.0, running=k)
        return m

    r = Router(RouterConfig(steal_margin=0.3, min_steal_gain_s=1.0))
    r.begin_step(range(40))
    busy, dry = InstanceView("busy", 256, measured()), InstanceView("dry", 256, measured())
    r.dispatch([busy], remaining=lambda s: 500.0)
    moves = r.steal([busy, dry], remaining=lambda s: 500.0, position=lambda s: 100)
    moved = [s for m in moves for s in m.sample_ids]
    assert moves and all(m.source == "busy" and m.target == "dry" for m in moves)
    assert 5 <= len(moved) <= 35  # it evens the load out, it does not swap it


def test_no_stealing_while_samples_wait_in_the_queue():
    r = Router(RouterConfig())
    r.begin_step(range(10))
    crowded = view("crowded", 8, 50.0, 100.0)
    r.dispatch([crowded], remaining=lambda s: 500.0)
    assert r.queued and r.steal([crowded, view("idle", 4, 50.0, 400.0)],
                                remaining=lambda s: 500.0, position=lambda s: 1) == []


def test_released_samples_go_to_the_front_and_spend_retry_budget():
    r = Router(RouterConfig(retry_budget=1))
    r.begin_step(range(6))
    r.dispatch([view("a", 2, 10.0, 20.0)], remaining=lambda s: 1.0)
    assert r.release("a", failed=True) == (0, 1)
    assert r.queued[:2] == (0, 1) and r.exhausted() == ()
    r.dispatch([view("b", 2, 10.0, 20.0)], remaining=lambda s: 1.0)
    assert r.samples_on("b") == (0, 1)
    r.release("b", failed=True)
    assert r.exhausted() == (0, 1)
    r.requeue([2], failed=False)
    assert 2 not in r.exhausted()


def test_config_validation():
    with pytest.raises(ValueError, match="steal_margin"):
        RouterConfig(steal_margin=1.0)
    with pytest.raises(ValueError, match="retry_budget"):
        RouterConfig(retry_budget=-1)


def test_the_published_scheduler_sends_whole_groups_round_robin_whatever_the_rates():
    from rlboost.controller.records import GROUP_STRIDE

    r = Router(RouterConfig(dispatch="group_round_robin"))
    groups = [[g * GROUP_STRIDE + j for j in range(4)] for g in range(5)]
    r.begin_step([sid for group in groups for sid in group])
    fast, slow = view("a-fast", 8, 100.0, 900.0), view("b-slow", 8, 100.0, 100.0)
    assigns = {a.instance_id: set(a.sample_ids) for a in r.dispatch([fast, slow], remaining=lambda s: 100.0)}
    # groups 0 and 2 on one, 1 and 3 on the other: never split, rates not looked at
    assert assigns == {"a-fast": {*groups[0], *groups[2]}, "b-slow": {*groups[1], *groups[3]}}
    assert r.queued == tuple(groups[4])  # no instance has room for a whole group: it waits whole
    with pytest.raises(ValueError, match="dispatch"):
        RouterConfig(dispatch="random")
