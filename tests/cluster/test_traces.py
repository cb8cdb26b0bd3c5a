"""Availability traces: the three file formats, scaling, synthetic traces, preemption events."""

import json

import pytest

from rlboost.cluster.traces import (
    AvailabilityTrace,
    InstanceEvent,
    PreemptionPolicy,
    SyntheticTraceConfig,
    load_trace,
    preemption_events,
    read_count_csv,
    read_skypilot_json,
    read_spotserve_csv,
    sample_trace,
    synthetic_trace,
)


def test_skypilot_json_is_one_count_per_tick(tmp_path):
    path = tmp_path / "us-west-2a_v100_1.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 0, 5, 16, 16, 8, 0]}))
    trace = read_skypilot_json(path)
    assert trace.times_s == (0.0, 600.0, 900.0, 1500.0, 1800.0)
    assert trace.counts == (0, 5, 16, 8, 0)
    assert trace.duration_s == 2100.0
    assert trace.name == "us-west-2a_v100_1"
    assert load_trace(path) == trace
    assert trace.instance_seconds() == 300 * (5 + 16 + 16 + 8)


def test_count_csv_with_header_comments_and_repeats(tmp_path):
    path = tmp_path / "counts.csv"
    path.write_text("# a comment\ntime,count\n10,2\n20,2\n35.5,1\n60,1\n")
    trace = read_count_csv(path)
    assert trace.times_s == (0.0, 10.0, 35.5) and trace.counts == (0, 2, 1)
    assert trace.duration_s == 60.0
    assert [trace.count_at(t) for t in (0, 9.9, 10, 35.4, 35.5, 59)] == [0, 0, 2, 2, 1, 1]
    assert read_count_csv(path, duration_s=100.0).duration_s == 100.0
    assert load_trace(path) == trace


def test_spotserve_events_count_the_nodes_up(tmp_path):
    path = tmp_path / "g4dn.csv"
    path.write_text("480000,add,node1\n540000,add,node2\n540000,add,node3\n"
                    "1440000,remove,node1\n1440000,remove,node3\n1500000,add,node4\n")
    trace = read_spotserve_csv(path)
    assert trace.times_s == (0.0, 480.0, 540.0, 1440.0, 1500.0)
    assert trace.counts == (0, 1, 3, 1, 2)
    assert load_trace(path) == trace


@pytest.mark.parametrize("reader,text,match", [
    (read_count_csv, "time,count\n0,1\nten,2\n", "line 3"),
    (read_count_csv, "0,1\n5,-1\n", "line 2"),
    (read_count_csv, "5,1\n3,2\n", "must not decrease"),
    (read_count_csv, "# only a comment\n", "no rows"),
    (read_spotserve_csv, "100,add,node1\n200,remove,node2\n", "line 2: remove of node 'node2'"),
    (read_spotserve_csv, "100,add,node1\n150,add,node1\n", "already"),
    (read_spotserve_csv, "100,launch,node1\n", "line 1"),
])
def test_malformed_files_name_the_line(tmp_path, reader, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        reader(path)


def test_malformed_skypilot_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"data": [1, 2]}))
    with pytest.raises(ValueError, match="not a SkyPilot spot trace"):
        read_skypilot_json(path)


def test_scaling_compression_window_and_cap():
    trace = AvailabilityTrace((0.0, 3600.0, 7200.0), (4, 1, 3), 10800.0)
    fast = trace.compressed_to(180.0)  # 3 hours -> 3 minutes
    assert fast.times_s == (0.0, 60.0, 120.0) and fast.counts == trace.counts
    assert fast.duration_s == 180.0
    assert trace.scaled(0.5).times_s == (0.0, 1800.0, 3600.0)
    part = trace.window(1800.0, 9000.0)
    assert part.times_s == (0.0, 1800.0, 5400.0) and part.counts == (4, 1, 3)
    assert part.duration_s == 7200.0
    assert trace.capped(2).counts == (2, 1, 2)
    with pytest.raises(ValueError):
        trace.window(100.0, 20000.0)


def test_trace_validation():
    with pytest.raises(ValueError, match="start at 0"):
        AvailabilityTrace((5.0,), (1,), 10.0)
    with pytest.raises(ValueError, match="strictly increase"):
        AvailabilityTrace((0.0, 5.0, 5.0), (1, 2, 3), 10.0)
    with pytest.raises(ValueError, match="ends before"):
        AvailabilityTrace((0.0, 5.0), (1, 2), 4.0)


def test_synthetic_traces_are_seeded_and_bounded():
    cfg = SyntheticTraceConfig(duration_s=24 * 3600.0, capacity=6, seed=3)
    trace = synthetic_trace(cfg)
    assert trace == synthetic_trace(cfg)
    assert trace != synthetic_trace(SyntheticTraceConfig(duration_s=24 * 3600.0, capacity=6, seed=4))
    assert trace.counts[0] == 6 and trace.max_count <= 6 and min(trace.counts) >= 0
    assert any(b < a for _, a, b in trace.changes())
    ticked = synthetic_trace(SyntheticTraceConfig(duration_s=3600.0 * 24, capacity=6, seed=3,
                                                  tick_s=300.0))
    assert all(t % 300.0 == 0 for t in ticked.times_s)


def test_synthetic_preemptions_come_in_clusters():
    # Storms rarely (every 2 h) but hitting every instance, spread over 2 minutes: losses
    # arrive in bursts, far closer together than the mean gap between storms.
    cfg = SyntheticTraceConfig(duration_s=48 * 3600.0, capacity=8, storm_fraction=1.0,
                               mean_storm_interval_s=7200.0, storm_spread_s=120.0,
                               mean_recovery_s=600.0, seed=1)
    losses = [t for t, a, b in synthetic_trace(cfg).changes() if b < a]
    gaps = [b - a for a, b in zip(losses, losses[1:])]
    within_burst = sum(g <= 120.0 for g in gaps)
    assert len(losses) >= 20 and within_burst / len(gaps) > 0.6


def test_count_drops_become_oldest_first_notices_and_kills():
    trace = AvailabilityTrace((0.0, 10.0, 20.0, 50.0), (1, 3, 1, 2), 60.0)
    events = preemption_events(trace, PreemptionPolicy(notice_s=5.0))
    assert [(e.time_s, e.instance_id, e.kind, e.deadline_s) for e in events] == [
        (0.0, "spot-0", "join", None),
        (10.0, "spot-1", "join", None), (10.0, "spot-2", "join", None),
        (15.0, "spot-0", "notice", 20.0), (15.0, "spot-1", "notice", 20.0),
        (20.0, "spot-0", "kill", 20.0), (20.0, "spot-1", "kill", 20.0),
        (50.0, "spot-3", "join", None)]
    assert not any(e.sudden for e in events)


def test_victim_orders_and_sudden_kills():
    trace = AvailabilityTrace((0.0, 10.0, 20.0, 30.0), (2, 3, 2, 0), 40.0)
    newest = preemption_events(trace, PreemptionPolicy(victim_order="newest", notice_s=0.0))
    kills = [(e.time_s, e.instance_id) for e in newest if e.kind == "kill"]
    assert kills == [(20.0, "spot-2"), (30.0, "spot-1"), (30.0, "spot-0")]
    assert all(e.sudden for e in newest if e.kind == "kill")  # zero notice: all sudden
    spread = preemption_events(trace, PreemptionPolicy(sudden_fraction=0.5, notice_s=3.0))
    kills = [e for e in spread if e.kind == "kill"]
    assert [k.sudden for k in kills] == [False, True, False]  # every second one is sudden
    rand = PreemptionPolicy(victim_order="random", sudden_fraction=0.5,
                            sudden_pattern="random", seed=9)
    assert preemption_events(trace, rand) == preemption_events(trace, rand)


def test_a_notice_never_precedes_the_join():
    trace = AvailabilityTrace((0.0, 100.0, 101.0), (0, 1, 0), 200.0)
    events = preemption_events(trace, PreemptionPolicy(notice_s=30.0))
    assert [(e.time_s, e.kind) for e in events] == [(100.0, "join"), (100.0, "notice"),
                                                    (101.0, "kill")]


def test_bundled_sample_preempts_with_notice_and_suddenly_when_compressed():
    trace = sample_trace().compressed_to(240.0)
    assert trace.duration_s == 240.0 and trace.max_count == 4
    events = preemption_events(trace, PreemptionPolicy(notice_s=2.0, sudden_fraction=0.5))
    kills = [e for e in events if e.kind == "kill"]
    assert len(kills) >= 2
    assert any(k.sudden for k in kills) and any(not k.sudden for k in kills)
    notices = {e.instance_id: e for e in events if e.kind == "notice"}
    for k in kills:
        if not k.sudden:
            assert notices[k.instance_id].deadline_s == k.time_s
            assert k.time_s - notices[k.instance_id].time_s == pytest.approx(2.0)
    # replaying the events reproduces the trace: after each instant, the count matches
    up = set()
    for i, e in enumerate(events):
        if e.kind == "join":
            up.add(e.instance_id)
        elif e.kind == "kill":
            up.remove(e.instance_id)
        if i + 1 == len(events) or events[i + 1].time_s != e.time_s:
            assert len(up) == trace.count_at(e.time_s)


def test_event_record_validation():
    with pytest.raises(ValueError, match="kind"):
        InstanceEvent(time_s=0.0, instance_id="a", kind="boom")
    with pytest.raises(ValueError, match="deadline"):
        InstanceEvent(time_s=5.0, instance_id="a", kind="notice", deadline_s=4.0)
    with pytest.raises(ValueError, match="format_version"):
        InstanceEvent(time_s=0.0, instance_id="a", kind="join", format_version=2)


@pytest.mark.parametrize("kwargs,field", [
    ({"capacity": 0}, "capacity"), ({"initial": 9}, "initial"),
    ({"storm_fraction": 0.0}, "storm_fraction"), ({"mean_recovery_s": 0.0}, "mean_recovery_s")])
def test_synthetic_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SyntheticTraceConfig(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    ({"victim_order": "youngest"}, "victim_order"), ({"notice_s": -1.0}, "notice_s"),
    ({"sudden_fraction": 1.5}, "sudden_fraction"), ({"sudden_pattern": "x"}, "sudden_pattern")])
def test_policy_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PreemptionPolicy(**kwargs)
