"""The registry owns each instance's lifecycle: every step of it is one numbered event, in
the order it happened, with the counts of placed instances after it; a listener that asks
for the events after the last one it has gets each once."""

import asyncio

import pytest

from rlboost.controller.clock import ManualClock
from rlboost.controller.events import EventLog, InstanceEvent
from rlboost.controller.records import InstanceInfo
from rlboost.controller.registry import Registry, RegistryConfig


def make():
    clock = ManualClock()
    return Registry(RegistryConfig(heartbeat_interval_s=1.0, missed_beats=3, drain_margin_s=5.0), clock), clock


def info(name, kind="preemptible", relay=""):
    return InstanceInfo(instance_id=name, kind=kind, capacity=4, relay_address=relay, pid=7, host="10.0.0.1")


def kinds(reg, instance):
    return [e.kind for e in reg.events.since(0) if e.instance_id == instance and e.kind != "loaded"]


def test_a_noticed_instance_goes_join_active_first_sample_notice_drained_gone():
    reg, clock = make()
    reg.place("spot-0", "preemptible", source="trace")
    assert reg.get("spot-0").state == "joining" and reg.placed("preemptible") == 1
    reg.register(info("spot-0"))
    reg.heartbeat("spot-0", 0)
    reg.served("spot-0", 3)
    clock.advance(1.0)
    reg.notice("spot-0", 30.0, source="cloud", cloud="aws")
    reg.mark_gone("spot-0", "drained after a preemption notice")  # its samples have left
    assert reg.placed("preemptible") == 1  # billed until the driver ends it
    reg.end("spot-0", "gone", reason="reclaimed")
    assert kinds(reg, "spot-0") == ["join", "active", "first_sample", "notice", "drained", "gone"]
    events = {e.kind: e for e in reg.events.since(0)}
    assert events["join"].details["source"] == "trace" and events["active"].details == {"pid": 7, "node": "10.0.0.1"}
    assert events["notice"].details == {"grace_s": 30.0, "source": "cloud", "cloud": "aws"}
    assert events["gone"].details == {"reason": "reclaimed", "source": "cloud"}  # the notice's source
    assert (events["notice"].preemptible_up, events["gone"].preemptible_up) == (1, 0)
    assert [e.seq for e in reg.events.since(0)] == list(range(1, reg.events.last_seq + 1))


def test_a_notice_before_the_instance_registers_means_it_is_never_active():
    reg, _ = make()
    reg.place("spot-0", "preemptible")
    reg.notice("spot-0", 10.0)
    reg.register(info("spot-0"))
    assert reg.heartbeat("spot-0", 0).state == "draining"
    reg.end("spot-0", "gone", reason="reclaimed")
    assert kinds(reg, "spot-0") == ["join", "notice", "drained", "gone"]


def test_a_notice_that_overtakes_the_placement_is_applied_when_the_instance_is_placed():
    """The driver's place and notice calls may reach the controller in either order: a notice
    for an instance not yet placed keeps its deadline and is heard at placement."""
    reg, clock = make()
    deadline = reg.notice("spot-0", 10.0, source="cloud")
    clock.advance(4.0)
    reg.place("spot-0", "preemptible")
    assert reg.get("spot-0").state == "draining" and reg.get("spot-0").deadline == deadline
    reg.register(info("spot-0"))
    assert reg.heartbeat("spot-0", 0).state == "draining"
    reg.end("spot-0", "gone", reason="reclaimed")
    assert kinds(reg, "spot-0") == ["join", "notice", "drained", "gone"]
    assert [e.details.get("source") for e in reg.events.since(0) if e.kind == "notice"] == ["cloud"]


def test_a_loss_without_notice_is_a_death_with_the_samples_that_resume_and_a_failure_carries_its_cause():
    reg, clock = make()
    for name in ("spot-0", "spot-1"):
        reg.register(info(name))
        reg.heartbeat(name, 0)
    clock.advance(3.5)
    reg.heartbeat("spot-1", 0)
    assert reg.expire(samples_of=lambda iid: 5) == ["spot-0"]
    reg.mark_lost("spot-1", "failed", cause="RuntimeError: boom")
    deaths = {e.instance_id: e.details for e in reg.events.since(0) if e.kind == "death"}
    assert deaths["spot-0"] == {"reason": "lost", "samples_resumed": 5, "source": "node"}
    assert deaths["spot-1"]["reason"] == "failed" and deaths["spot-1"]["cause"] == "RuntimeError: boom"
    assert reg.get("spot-0").state == reg.get("spot-1").state == "lost" and reg.placed("preemptible") == 0
    reg.end("spot-0", "death", reason="killed")  # the driver's end of an instance already lost: no second event
    assert kinds(reg, "spot-0") == ["join", "active", "death"]


def test_a_lease_names_the_version_and_the_relays_of_the_peers_that_are_up_and_not_noticed():
    reg, _ = make()
    reg.set_weight_version(2)
    for name in ("a", "b", "c"):
        reg.register(info(name, relay=f"10.0.0.{ord(name)}:7000"))
    reg.notice("c", 60.0)
    lease = reg.heartbeat("a", 1)
    assert (lease.state, lease.weight_version, lease.peers) == ("pulling", 2, ("10.0.0.98:7000",))


def test_a_listener_gets_each_event_once_and_waits_for_the_next():
    log = EventLog(kept=3)
    for n in range(5):
        log.append("join", f"spot-{n}", "preemptible", float(n), (n + 1, 0))
    assert [e.seq for e in log.since(0)] == [3, 4, 5]  # older ones were dropped
    assert log.since(5) == []

    async def listen():
        asyncio.get_running_loop().call_later(0.01, log.append, "gone", "spot-0", "preemptible", 9.0, (4, 0))
        return await log.after(5, timeout_s=60.0), await log.after(6, timeout_s=0.0)
    (event,), none = asyncio.run(listen())
    assert (event.seq, event.kind) == (6, "gone") and none == []
    with pytest.raises(ValueError, match="kind"):
        InstanceEvent(seq=1, kind="exploded", instance_id="x", pool="preemptible", at_s=0.0, preemptible_up=0,
                      reserved_up=0)
