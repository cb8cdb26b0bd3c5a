"""Registry: lease expiry on a manual clock, weight-version gating, drains."""

import pytest

from rlboost.controller.clock import ManualClock
from rlboost.controller.records import InstanceInfo
from rlboost.controller.registry import Registry, RegistryConfig
from rlboost.errors import RolloutError


def make(max_staleness=0, **kw):
    clock = ManualClock()
    cfg = RegistryConfig(**{**dict(heartbeat_interval_s=1.0, missed_beats=3, drain_margin_s=5.0), **kw})
    return Registry(cfg, clock, max_staleness=max_staleness), clock


def info(name, kind="preemptible"):
    return InstanceInfo(instance_id=name, kind=kind, capacity=4)


def test_instance_goes_joining_pulling_active_and_only_active_current_ones_are_routable():
    reg, clock = make()
    reg.set_weight_version(3)
    assert reg.register(info("a")).state == "joining"
    assert reg.heartbeat("a", weight_version=2).state == "pulling"
    assert reg.routable() == []
    lease = reg.heartbeat("a", weight_version=3)
    assert (lease.state, lease.weight_version) == ("active", 3)
    assert [r.instance_id for r in reg.routable("preemptible")] == ["a"]
    assert reg.routable("reserved") == []
    reg.set_weight_version(4)  # a new version makes it stale again
    assert reg.get("a").state == "pulling" and reg.routable() == []


def test_staleness_window_keeps_slightly_old_instances_routable():
    reg, _ = make(max_staleness=1)
    reg.set_weight_version(5)
    reg.register(info("a"))
    reg.heartbeat("a", 4)
    assert reg.get("a").state == "active"
    reg.register(info("b"))
    reg.heartbeat("b", 3)
    assert reg.get("b").state == "pulling"


def test_a_late_report_of_an_older_version_leaves_the_instance_active():
    """A load() answer or a heartbeat sent before the instance's last load finished can
    arrive after the report of the new version: the instance stays active at the new one
    (a step started then would otherwise skip it)."""
    reg, _ = make()
    reg.set_weight_version(1)
    reg.register(info("a"))
    reg.heartbeat("a", 1)
    assert reg.get("a").state == "active"
    reg.heartbeat("a", 0)
    assert reg.get("a").state == "active" and reg.get("a").weight_version == 1
    assert [r.instance_id for r in reg.routable()] == ["a"]


def test_missed_heartbeats_declare_an_instance_dead():
    reg, clock = make()
    reg.register(info("a"))
    reg.register(info("b"))
    clock.advance(2.0)
    reg.heartbeat("b", 0)
    clock.advance(1.5)  # a: 3.5 s silent > 3 beats of 1 s; b: 1.5 s
    assert reg.expire() == ["a"]
    assert reg.get("a").state == "lost" and "heartbeat" in reg.get("a").gone_reason
    assert [r.instance_id for r in reg.live()] == ["b"]
    with pytest.raises(RolloutError, match="lost"):
        reg.heartbeat("a", 0)
    assert reg.register(info("a")).state == "joining"  # a new life after it is lost


def test_notice_drains_margin_before_the_deadline_or_at_once_when_grace_is_short():
    reg, clock = make()
    for name in ("gcp", "aws", "short"):
        reg.register(info(name))
        reg.heartbeat(name, 0)
    assert reg.notice("gcp", 30.0) == 30.0
    assert reg.notice("aws", 120.0) == 120.0
    reg.notice("short", 2.0)
    assert reg.routable() == []
    assert [r.instance_id for r in reg.drains_due()] == ["short"]
    clock.advance(25.0)
    assert [r.instance_id for r in reg.drains_due()] == ["gcp", "short"]
    assert reg.notice("gcp", 60.0) == 30.0  # a later notice cannot extend the deadline


def test_bad_input_is_rejected_with_clear_errors():
    reg, _ = make()
    reg.register(info("a"))
    with pytest.raises(ValueError, match="already registered"):
        reg.register(info("a"))
    with pytest.raises(RolloutError, match="not registered"):
        reg.heartbeat("nope")
    with pytest.raises(ValueError, match="grace_s"):
        reg.notice("a", -1.0)
    reg.set_weight_version(2)
    with pytest.raises(ValueError, match="go back"):
        reg.set_weight_version(1)
    with pytest.raises(ValueError, match="missed_beats"):
        RegistryConfig(missed_beats=0)
    with pytest.raises(ValueError, match="kind"):
        InstanceInfo(instance_id="x", kind="spot", capacity=1)
    with pytest.raises(ValueError, match="capacity"):
        InstanceInfo(instance_id="x", kind="reserved", capacity=0)
