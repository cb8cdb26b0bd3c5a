"""The spot capacity planner: for a run config and a price pair (the reserved cluster's $/h, a
preemptible instance's $/h), throughput and tokens per dollar against the number of
preemptible instances and the spot discount, the best count, and where adding instances stops
paying.

Throughput does not depend on prices, so each count is simulated once (short runs) and every
discount is priced from that run's reserved hours and instance-hours. A discount is the spot
price's cut from what the instance's GPUs cost on demand at the reserved cluster's price per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rlboost.sim.metrics import SimSummary

DISCOUNTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True, slots=True)
class PlanPoint:
    """One instance count's simulated run, over its measured steps: tokens (prompt + response),
    modelled seconds, the reserved cluster's dollars and the preemptible instance-hours."""

    instances: int
    tokens: float
    seconds: float
    reserved_usd: float
    instance_hours: float

    @classmethod
    def of(cls, instances: int, s: SimSummary, reserved_usd_h: float, instance_usd_h: float) -> PlanPoint:
        reserved = reserved_usd_h * s.seconds / 3600.0
        hours = max(0.0, s.usd - reserved) / instance_usd_h if instance_usd_h > 0 else 0.0
        return cls(instances, s.tokens, s.seconds, reserved, hours)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def usd_per_hour(self, instance_usd_h: float) -> float:
        return (self.reserved_usd + self.instance_hours * instance_usd_h) / self.seconds * 3600.0

    def tokens_per_usd(self, instance_usd_h: float) -> float:
        return self.tokens / (self.reserved_usd + self.instance_hours * instance_usd_h)


@dataclass(frozen=True, slots=True)
class SpotPlan:
    """Every count's run and the prices: `instance_usd_h` is the spot price asked about, and
    `on_demand_instance_usd_h` what the instance's GPUs cost on demand (discount 0)."""

    name: str
    reserved_usd_h: float
    instance_usd_h: float
    on_demand_instance_usd_h: float
    points: tuple[PlanPoint, ...]

    def __post_init__(self) -> None:
        counts = [p.instances for p in self.points]
        if not counts or counts[0] != 0 or counts != sorted(set(counts)):
            raise ValueError(f"a plan needs reserved only (0 instances) first and rising counts, got {counts}")
        if not (self.reserved_usd_h > 0 and self.instance_usd_h > 0 and self.on_demand_instance_usd_h > 0):
            raise ValueError("prices must be > 0 $/h")

    @property
    def base(self) -> PlanPoint:
        return self.points[0]

    @property
    def discount(self) -> float:
        """The asked spot price's discount."""
        return 1.0 - self.instance_usd_h / self.on_demand_instance_usd_h

    def price(self, discount: float) -> float:
        return self.on_demand_instance_usd_h * (1.0 - discount)

    def gain(self, p: PlanPoint, price: float) -> float:
        """Tokens per $ over reserved only's at this instance price."""
        return p.tokens_per_usd(price) / self.base.tokens_per_usd(price)

    def best(self, price: float) -> PlanPoint:
        """The count with the most tokens per $ at this price (the fewest on a tie)."""
        return max(self.points, key=lambda p: (round(p.tokens_per_usd(price), 6), -p.instances))

    def stops_paying(self, price: float) -> int | None:
        """The count past which adding instances stops paying: no larger count tried gives more
        tokens per $ (the best count); None: the largest count tried is the best."""
        best = self.best(price).instances
        return None if best == self.points[-1].instances else best

    def break_even_discount(self, p: PlanPoint) -> float | None:
        """The discount from which this count gives at least reserved only's tokens per $ (None:
        it is not faster, so no price makes it pay; 0 or less: it pays even on demand)."""
        if p.instance_hours <= 0 or p.tokens_per_s <= self.base.tokens_per_s:
            return None
        per_usd = self.base.tokens_per_usd(0.0)
        price = (p.tokens / per_usd - p.reserved_usd) / p.instance_hours
        return 1.0 - price / self.on_demand_instance_usd_h


def plan_spot(name: str, summaries: Callable[[int], SimSummary], counts, *, reserved_usd_h: float,
              instance_usd_h: float, on_demand_instance_usd_h: float) -> SpotPlan:
    """Simulate each count (summaries(n): the summary of a run with n instances) and price it."""
    points = tuple(PlanPoint.of(n, summaries(n), reserved_usd_h, instance_usd_h) for n in sorted(set(counts)))
    return SpotPlan(name, reserved_usd_h, instance_usd_h, on_demand_instance_usd_h, points)


def plan_table(plan: SpotPlan, discounts=DISCOUNTS) -> list[str]:
    """The table: each count's throughput, and at the asked price its $/h and tokens per $;
    then tokens per $ over reserved only at each discount, and each count's break-even."""
    price = plan.instance_usd_h
    head = f"{'instances':>9}{'tokens/s':>10}{'speedup':>9}{'$/h':>9}{'tokens/$':>10}{'gain':>8}{'break-even':>12}"
    grid = "".join(f"{d:>7.0%}" for d in discounts)
    lines = [f"{'':66}tokens per $ over reserved only, by spot discount", head + " |" + grid]
    for p in plan.points:
        be = plan.break_even_discount(p)
        be_s = "-" if p.instances == 0 else ("never" if be is None else f"{max(be, 0.0):.0%}")
        cells = "".join(f"{plan.gain(p, plan.price(d)):>7.2f}" for d in discounts)
        lines.append(f"{p.instances:>9}{p.tokens_per_s:>10.0f}{p.tokens_per_s / plan.base.tokens_per_s:>8.2f}x"
                     f"{p.usd_per_hour(price):>9.2f}{p.tokens_per_usd(price):>10.0f}"
                     f"{(plan.gain(p, price) - 1) * 100:>+7.1f}%{be_s:>12} |{cells}")
    best = "".join(f"{plan.best(plan.price(d)).instances:>7}" for d in discounts)
    lines.append(f"{'best count by discount':>66} |{best}")
    return lines


def headline(plan: SpotPlan) -> str:
    """One line: the best count at the asked prices, its gains, and where adding stops paying."""
    price, best = plan.instance_usd_h, plan.best(plan.instance_usd_h)
    stop, top = plan.stops_paying(price), plan.points[-1]
    stop_s = (f"adding instances stops paying past {stop} (more add throughput, up to "
              f"{top.tokens_per_s / plan.base.tokens_per_s:.2f}x at {top.instances}, not tokens per $)"
              if stop is not None else f"adding instances pays up to the largest count tried ({top.instances})")
    be = plan.break_even_discount(best)
    be_s = "" if be is None or best.instances == 0 else f"; {best.instances} instances beat reserved only " \
        f"from a {max(be, 0.0):.0%} discount"
    return (f"{plan.name} at ${plan.reserved_usd_h:.2f}/h reserved and ${price:.2f}/h per instance "
            f"({plan.discount:.0%} off on demand): best {best.instances} instances, "
            f"{best.tokens_per_s / plan.base.tokens_per_s:.2f}x tokens/s, "
            f"{(plan.gain(best, price) - 1) * 100:+.1f}% tokens per $; {stop_s}{be_s}")


def plot_plan(plan: SpotPlan, path, discounts=(0.3, 0.5, 0.7, 0.9)) -> None:
    """Throughput and tokens per $ (over reserved only) against the instance count: tokens per $
    at the asked price and at a few discounts."""
    from rlboost.sim.report import _pyplot

    plt = _pyplot()
    xs = [p.instances for p in plan.points]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(xs, [p.tokens_per_s / plan.base.tokens_per_s for p in plan.points], "o-", color="black",
            label="throughput")
    for d in discounts:
        ax.plot(xs, [plan.gain(p, plan.price(d)) for p in plan.points], "--", lw=1, label=f"tokens per $, {d:.0%} off")
    ax.plot(xs, [plan.gain(p, plan.instance_usd_h) for p in plan.points], "s-", color="tab:red",
            label=f"tokens per $ at ${plan.instance_usd_h:.2f}/h ({plan.discount:.0%} off)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(plan.best(plan.instance_usd_h).instances, ls=":", color="tab:red", lw=1)
    ax.set_xticks(xs)
    ax.set_xlabel("preemptible instances")
    ax.set_ylabel("x reserved only")
    ax.set_title(f"{plan.name}: throughput and tokens per $ against preemptible instances", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
