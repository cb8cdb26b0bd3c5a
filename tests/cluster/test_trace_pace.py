"""A trace's pace and its notices: a file or measured trace replays at its own pace unless
cluster.trace_duration_s says otherwise (a synthetic sample is compressed into the run), the
simulation's summary says which, and a notice lasts what the trace's cloud gives unless
cluster.notice_s is set."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.traces.replay import DEFAULT_NOTICE_S, named_trace, notice_seconds, replay_span, trace_cloud
from rlboost.config.overrides import apply_overrides
from rlboost.recipes.paper_qwen3_8b import TIME_SCALE
from rlboost.recipes.scenarios import get_scenario
from rlboost.run.simulate import sim_spec
from rlboost.sim.simulator import Simulator


def _day_trace(tmp_path, name="day.csv"):
    path = tmp_path / name
    path.write_text("time,count\n0,2\n3600,1\n43200,2\n86400,2\n")  # 24 hours
    return path


def test_a_file_trace_replays_at_its_own_pace_in_the_paper_trace_scenario(tmp_path):
    path = _day_trace(tmp_path)
    config = apply_overrides(get_scenario("paper-trace").config(), [f"cluster.trace={path}"])
    trace = named_trace(config.cluster.trace, max_count=4)
    span, pace = replay_span(config.cluster, trace, fit_s=100.0, time_scale=TIME_SCALE)
    assert span == pytest.approx(86400 / TIME_SCALE) and "own pace" in pace  # not the bundled trace's 9 hours
    result = Simulator(sim_spec(config, steps=2)).run()
    assert "own pace (86,400 s)" in result.trace_pace


def test_trace_duration_s_and_synthetic_samples_are_compressed(tmp_path):
    trace = named_trace(str(_day_trace(tmp_path)), max_count=4)
    fixed = ClusterConfig(trace=str(_day_trace(tmp_path)), trace_duration_s=50.0)
    span, pace = replay_span(fixed, trace, fit_s=100.0)
    assert span == 50.0 and "trace_duration_s" in pace
    sample = ClusterConfig(trace="sample")
    span, pace = replay_span(sample, named_trace("sample", max_count=4), fit_s=100.0)
    assert span == 100.0 and "trace_fraction" in pace
    measured = ClusterConfig(trace="aws-spot-4node")
    assert replay_span(measured, named_trace("aws-spot-4node", max_count=4), fit_s=1.0)[0] == 109 * 300


def test_notices_follow_the_traces_cloud_unless_set(tmp_path):
    gcp = _day_trace(tmp_path, "gcp_us-central1_a100.csv")
    azure = tmp_path / "trace.json"
    azure.write_text(json.dumps({"metadata": {"gap_seconds": 60, "cloud": "Azure"}, "data": [1, 2, 2]}))
    assert trace_cloud("aws-spot-4node") == "aws" and trace_cloud(str(gcp)) == "gcp"
    assert trace_cloud(str(azure)) == "azure" and trace_cloud("sample") is None
    assert notice_seconds(ClusterConfig(trace="aws-spot-4node"), time_scale=25.0) == pytest.approx(120.0 / 25.0)
    assert notice_seconds(ClusterConfig(trace=str(gcp))) == 30.0
    assert notice_seconds(ClusterConfig(trace=str(azure))) == 30.0
    assert notice_seconds(ClusterConfig(trace="sample")) == DEFAULT_NOTICE_S
    assert notice_seconds(ClusterConfig(trace=str(gcp), notice_s=12.0)) == 12.0  # set: it wins
    config = apply_overrides(get_scenario("paper-trace").config(), [f"cluster.trace={gcp}"])
    assert "notices 30 modelled s" in Simulator(sim_spec(config, steps=2)).run().trace_pace
    with pytest.raises(ValueError, match="notice_s"):
        dataclasses.replace(ClusterConfig(), notice_s=-1.0)
