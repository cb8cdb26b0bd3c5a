"""The spot planner: its pricing of each count's run at any discount, the best count, where
adding instances stops paying and the break-even discount; and `rlboost simulate --scenario
sweep` end to end on a small shape."""

from __future__ import annotations

import json

import pytest

from rlboost.sim.planner import PlanPoint, SpotPlan, headline


def _plan(rates, price=5.0, on_demand=20.0) -> SpotPlan:
    """Counts 0..n: `rates[n]` tokens/s over an hour, the reserved cluster at $80/h, n instances up all along."""
    points = tuple(PlanPoint(n, rate * 3600.0, 3600.0, 80.0, float(n)) for n, rate in enumerate(rates))
    return SpotPlan("test", 80.0, price, on_demand, points)


def test_each_count_is_priced_at_any_discount():
    plan = _plan([100.0, 150.0])
    one = plan.points[1]
    assert one.tokens_per_usd(5.0) == pytest.approx(150 * 3600 / 85.0)
    assert plan.price(0.75) == pytest.approx(5.0) and plan.discount == pytest.approx(0.75)
    assert plan.gain(one, plan.price(0.0)) == pytest.approx((150 / 100.0) * 80 / 100.0)
    # break-even: 150 * 3600 / (80 + p) = 100 * 3600 / 80  ->  p = 40 $/h, above on demand: pays at any discount
    assert plan.break_even_discount(one) == pytest.approx(1 - 40.0 / 20.0)


def test_best_count_and_where_adding_stops_paying():
    plan = _plan([100.0, 99.0, 130.0, 140.0, 141.0, 149.0])  # one alone does not pay; past 3 it stops
    assert plan.best(5.0).instances == 3
    assert plan.stops_paying(5.0) == 3  # 5 instances raise tokens per $ over 4, but not over 3
    assert plan.break_even_discount(plan.points[1]) is None  # not faster: no price makes it pay
    assert plan.best(20.0).instances == 0  # on demand, reserved only is cheapest per token
    assert _plan([100.0, 150.0, 200.0]).stops_paying(5.0) is None  # still paying at the largest count
    assert "best 3 instances" in headline(plan) and "stops paying past 3" in headline(plan)


def test_a_plan_needs_reserved_only_and_prices():
    with pytest.raises(ValueError, match="reserved only"):
        SpotPlan("x", 80.0, 5.0, 20.0, (PlanPoint(1, 1.0, 1.0, 1.0, 1.0),))
    with pytest.raises(ValueError, match="prices"):
        _plan([100.0], price=0.0)


def test_sweep_scenario_prints_the_best_count(tmp_path, monkeypatch):
    from rlboost.run.simulate import simulate

    monkeypatch.setenv("RLBOOST_RUN_ROOT", str(tmp_path))
    lines: list[str] = []
    path = simulate("sweep", ["task.groups_per_step=8", "cost.preemptible_usd_per_hour=4.0"], steps=3,
                    progress=False, echo=lines.append)
    plan = json.loads((path / "plan.json").read_text())
    assert [p["instances"] for p in plan["points"]] == [0, 1, 2, 3, 4, 5, 6, 8]
    assert plan["instance_usd_per_hour"] == 4.0
    best = max(plan["points"], key=lambda p: p["tokens_per_usd"])["instances"]
    assert plan["best_instances"] == best
    assert any(line.startswith("paper_qwen3_8b at $83.79/h reserved and $4.00/h") and f"best {best} instances" in line
               for line in lines)
    assert (path / "plots" / "plan.png").stat().st_size > 0 and "break-even" in (path / "summary.md").read_text()
