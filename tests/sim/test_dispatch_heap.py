"""Router.dispatch places queued samples exactly as its one-by-one scan would, also through
the heap it uses while queued samples expect the same work (the simulator's hundreds of
instances at a step's start)."""

from __future__ import annotations

import random

import pytest

from rlboost.controller.estimates import RateModel
from rlboost.controller.router import InstanceView, Router, RouterConfig


def _scan_reference(queue, views, held, need):
    """The placement rule, sample by sample: least (work + need) / full rate, then fewest samples, then id."""
    load = {v.instance_id: [len(held.get(v.instance_id, ())), sum(need(s) for s in held.get(v.instance_id, ()))]
            for v in views}
    out = {}
    for sid in queue:
        best = min((v for v in views if load[v.instance_id][0] < v.capacity),
                   key=lambda v: ((load[v.instance_id][1] + need(sid)) / v.rates.full_rate(v.capacity),
                                  load[v.instance_id][0], v.instance_id), default=None)
        if best is None:
            break
        load[best.instance_id][0] += 1
        load[best.instance_id][1] += need(sid)
        out[sid] = best.instance_id
    return out


@pytest.mark.parametrize("seed", range(6))
def test_dispatch_matches_the_scan(seed):
    rng = random.Random(seed)
    views = [InstanceView(f"i{k:02d}", rng.randint(1, 12), RateModel(rng.uniform(5, 50), rng.uniform(100, 900)))
             for k in range(rng.randint(1, 30))]
    held = {v.instance_id: [10_000 + 100 * k + j for j in range(rng.randint(0, v.capacity))]
            for k, v in enumerate(views)}
    queue = list(range(rng.randint(1, 200)))
    # runs of samples expecting the same work (fresh ones), then resumed ones expecting less
    needs = {sid: 300.0 if sid < len(queue) // 2 else rng.choice([300.0, 120.0, 77.0]) for sid in queue}
    needs.update({sid: 250.0 for sids in held.values() for sid in sids})
    router = Router(RouterConfig())
    router.begin_step(queue)
    for iid, sids in held.items():
        for sid in sids:
            router.assign(sid, iid)
    placed = {sid: a.instance_id for a in router.dispatch(views, needs.__getitem__) for sid in a.sample_ids}
    assert placed == _scan_reference(queue, views, held, needs.__getitem__)
