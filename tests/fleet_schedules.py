"""Random preemption schedules for property tests: spot instances at the start, then joins,
notices (with a grace period), sudden deaths and, where asked, speed changes, at random times."""

from typing import Callable

from hypothesis import strategies as st

from rlboost.sim import FleetEvent, SimInstance


@st.composite
def fleet_schedules(draw, spot: Callable[[str], st.SearchStrategy[SimInstance]], *, initial: tuple[int, int],
                    events: tuple[int, int], horizon_s: float, grace_s: float,
                    speed_factor: tuple[float, float] | None = None):
    """(initial instances, events). spot(name) draws one instance; initial and events are
    (min, max) counts; events fall in [0, horizon_s]; a notice's grace is up to grace_s;
    speed_factor (min, max) adds "speed" events that scale an instance's speed."""
    kinds = ["join", "notice", "death"] + (["speed"] if speed_factor else [])
    first = [draw(spot(f"spot-{i}")) for i in range(draw(st.integers(*initial)))]
    names, schedule = [s.instance_id for s in first], []
    for k in range(draw(st.integers(*events))):
        at = draw(st.floats(0.0, horizon_s))
        kind = draw(st.sampled_from(kinds if names else ["join"]))
        if kind == "join":
            spec = draw(spot(f"late-{k}"))
            names.append(spec.instance_id)
            schedule.append(FleetEvent(at_s=at, kind="join", instance_id=spec.instance_id, spec=spec))
        else:
            extra = {"factor": draw(st.floats(*speed_factor))} if speed_factor else {}
            schedule.append(FleetEvent(at_s=at, kind=kind, instance_id=draw(st.sampled_from(names)),
                                       grace_s=draw(st.floats(0.0, grace_s)), **extra))
    return first, schedule


def real_engine_spots(name: str) -> st.SearchStrategy[SimInstance]:
    """An instance of a real engine (no emulated speeds): it pulls at once and runs 1-4 samples."""
    return st.builds(lambda capacity: SimInstance(instance_id=name, pull_s=0.0, capacity=capacity), st.integers(1, 4))
