"""Replaying a trace on a fleet: the bundled trace, capped and compressed to a run, gives
preemptions of both kinds, and the replay applies joins, notices and sudden kills, never
holding more instances than the trace allows."""

from __future__ import annotations

import threading

from rlboost.cluster.traces import AvailabilityTrace, InstanceEvent
from rlboost.cluster.traces.replay import TraceReplay, named_trace, trace_events


class FakeFleetForTests:
    """Records what the replay asks of the fleet."""

    def __init__(self):
        self.calls = []

    def join(self, instance_id, kind):
        self.calls.append(("join", instance_id))

    def notice(self, instance_id, grace_s):
        self.calls.append(("notice", instance_id, round(grace_s, 6)))

    def kill(self, instance_id):
        self.calls.append(("kill", instance_id))

    def wait_ended(self, instance_id, timeout_s):
        return True  # a noticed instance ends at once here


def test_sample_trace_for_a_short_run_has_both_kinds_of_preemption():
    trace = named_trace("sample", max_count=3)
    assert trace.max_count == 3
    events = trace_events(trace.compressed_to(60.0), notice_s=4.0, sudden_fraction=0.5)
    notices = [e for e in events if e.kind == "notice"]
    sudden = [e for e in events if e.sudden]
    assert len(notices) >= 1 and len(sudden) >= 1
    assert all(0 <= e.time_s <= 60.0 for e in events)
    assert all(e.deadline_s - e.time_s <= 4.0 + 1e-9 for e in notices)
    joined = {e.instance_id for e in events if e.kind == "join"}
    assert {e.instance_id for e in notices + sudden} <= joined


def test_no_trace_means_no_events():
    assert named_trace("none", max_count=3) is None
    assert named_trace("sample", max_count=0) is None
    assert trace_events(None, notice_s=1.0, sudden_fraction=0.5) == ()


def test_replay_applies_joins_notices_and_only_sudden_kills():
    trace = named_trace("sample", max_count=3).compressed_to(0.2)
    events = trace_events(trace, notice_s=0.01, sudden_fraction=0.5)
    fleet = FakeFleetForTests()
    replay = TraceReplay(fleet, events).start()
    assert replay.wait(timeout=30) and replay.error is None
    assert replay.applied == len(events)
    expected = []
    for e in events:
        if e.kind == "join":
            expected.append(("join", e.instance_id))
        elif e.kind == "notice":
            expected.append(("notice", e.instance_id, round(e.deadline_s - e.time_s, 6)))
        elif e.sudden:  # a noticed instance dies at its deadline by the fleet's own timer
            expected.append(("kill", e.instance_id))
    assert fleet.calls == expected


def test_replay_from_an_offset_starts_with_the_instances_up_then_and_skips_the_past():
    events = (InstanceEvent(time_s=0.0, instance_id="spot-0", kind="join"),
              InstanceEvent(time_s=0.0, instance_id="spot-1", kind="join"),
              InstanceEvent(time_s=1.0, instance_id="spot-0", kind="notice", deadline_s=3.0),
              InstanceEvent(time_s=2.0, instance_id="spot-2", kind="join"),
              InstanceEvent(time_s=3.0, instance_id="spot-0", kind="kill", deadline_s=3.0),
              InstanceEvent(time_s=4.0, instance_id="spot-1", kind="kill"),
              InstanceEvent(time_s=4.1, instance_id="spot-3", kind="join"))
    fleet = FakeFleetForTests()
    replay = TraceReplay(fleet, events).start(offset_s=2.5)
    assert replay.wait(timeout=30) and replay.error is None
    # spot-0 was noticed before the offset: gone; spot-1 and spot-2 were up: they join at once
    assert fleet.calls == [("join", "spot-1"), ("join", "spot-2"), ("kill", "spot-1"), ("join", "spot-3")]
    assert replay.position_s >= 4.1


class TimedFakeFleetForTests:
    """Like the real fleet: a noticed instance ends grace_s after its notice on a timer of
    its own, and a preemption first waits busy_s for its victim to hold samples (which it
    never does here), unless stop_waits() ends the wait. Records the most instances up at
    once; `waiting` is set while a preemption waits."""

    def __init__(self, busy_s):
        self.busy_s, self.up, self.peak, self.order = busy_s, set(), 0, []
        self._cond = threading.Condition()
        self.waiting, self._interrupted = threading.Event(), threading.Event()

    def join(self, instance_id, kind):
        with self._cond:
            self.up.add(instance_id)
            self.peak = max(self.peak, len(self.up))
            self.order.append(("join", instance_id))

    def _end(self, instance_id, how):
        with self._cond:
            self.up.discard(instance_id)
            self.order.append((how, instance_id))
            self._cond.notify_all()

    def notice(self, instance_id, grace_s):
        self.order.append(("notice", instance_id))
        threading.Timer(grace_s, self._end, args=(instance_id, "gone")).start()

    def kill(self, instance_id):
        self._end(instance_id, "death")

    def wait_busy(self, instance_id, timeout_s):
        self.waiting.set()
        self._interrupted.wait(min(timeout_s, self.busy_s))
        self.waiting.clear()
        return False

    def stop_waits(self):
        self._interrupted.set()

    def wait_ended(self, instance_id, timeout_s):
        with self._cond:
            return self._cond.wait_for(lambda: instance_id not in self.up, timeout_s)


def test_a_late_notice_delays_the_replacement_so_the_cap_holds():
    """A notice applied late (its victim never got busy) ends late; the instance the trace
    brings in after that preemption joins only once the noticed one is gone, so the fleet
    never holds more instances than the trace's cap (the progress bar's up=4 of 3)."""
    trace = AvailabilityTrace.from_steps([(0.0, 3), (0.6, 2), (0.65, 3), (1.2, 2), (1.25, 3)], duration_s=1.5)
    events = trace_events(trace, notice_s=0.3, sudden_fraction=0.0)
    assert sum(e.kind == "notice" for e in events) == 2
    fleet = TimedFakeFleetForTests(busy_s=0.25)
    replay = TraceReplay(fleet, events, busy_wait_s=0.25).start()
    assert replay.wait(timeout=30) and replay.error is None
    assert fleet.peak == 3
    for e in events:
        if e.kind == "kill":  # each replacement joined after the instance it replaces left
            replacement = next(x for x in events if x.kind == "join" and x.time_s > e.time_s)
            assert fleet.order.index(("gone", e.instance_id)) < fleet.order.index(("join", replacement.instance_id))


def test_stopping_a_replay_ends_a_wait_for_its_victim_to_get_busy():
    """A run that ends while the replay waits for a victim to hold samples (a short run's
    last preemption) stops the replay at once: the victim is left alone and nothing later
    is applied, and the run's close does not sit out the wait."""
    events = (InstanceEvent(time_s=0.0, instance_id="spot-0", kind="join"),
              InstanceEvent(time_s=0.0, instance_id="spot-0", kind="notice", deadline_s=1.0),
              InstanceEvent(time_s=0.1, instance_id="spot-1", kind="join"))
    fleet = TimedFakeFleetForTests(busy_s=600.0)
    replay = TraceReplay(fleet, events, busy_wait_s=600.0).start()
    assert fleet.waiting.wait(timeout=30)  # the replay is now waiting on spot-0
    assert fleet.order == [("join", "spot-0")]
    replay.stop()
    assert replay.wait(timeout=0) and replay.error is None
    assert fleet.order == [("join", "spot-0")]
