"""The public trace formats: the bundled samples of each read back, a run can name them, and
a malformed file is refused naming its line."""

from __future__ import annotations

import pytest

from rlboost.cluster.traces import SAMPLES, load_trace, read_bamboo_csv, read_spotserve_segment, sample_trace
from rlboost.cluster.traces.replay import named_trace


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_bundled_sample_reads_and_can_be_named(name):
    trace = sample_trace(name)
    assert trace.max_count == 4 and trace.duration_s >= 7200 and trace.changes()
    assert named_trace(name, max_count=2).max_count == 2


def test_bamboo_with_or_without_header(tmp_path):
    with_header = tmp_path / "b.csv"
    with_header.write_text("seconds,available_instances\n0,3\n600.5,1\n1200,2\n")
    bare = tmp_path / "c.csv"
    bare.write_text("0,3\n600.5,1\n1200,2\n")
    for path in (with_header, bare):
        t = read_bamboo_csv(path)
        assert (t.count_at(0), t.count_at(700), t.count_at(1300)) == (3, 1, 2)
    assert load_trace(with_header).counts == (3, 1, 2)


def test_spotserve_segment(tmp_path):
    seg = tmp_path / "trace_0203.txt"
    seg.write_text('[0, "add", {"nodes": ["a", "b"]}]\n[60000, "remove", {"nodes": ["a"]}]\n'
                   '[90000, "DONE", {}]\n')
    t = read_spotserve_segment(seg)
    assert (t.count_at(10), t.count_at(70), t.duration_s) == (2, 1, 90.0)
    assert load_trace(seg).counts == t.counts


def test_malformed_files_name_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("seconds,available_instances\n0,3\nsoon,2\n")
    with pytest.raises(ValueError, match="line 3"):
        read_bamboo_csv(bad)
    seg = tmp_path / "s.jsonl"
    seg.write_text('[0, "add", {"nodes": ["a"]}]\n[5, "remove", {"nodes": ["b"]}]\n')
    with pytest.raises(ValueError, match="line 2"):
        read_spotserve_segment(seg)


def test_the_measured_trace_names_its_source_and_is_read_whole():
    import json

    doc = json.loads(SAMPLES["aws-spot-4node"].read_text())
    assert "skypilot-org/spot-traces" in doc["metadata"]["source"] and doc["metadata"]["gap_seconds"] == 300
    trace = sample_trace("aws-spot-4node")
    assert trace.duration_s == 300 * len(doc["data"])  # every tick, the last one included
    assert [trace.count_at(300 * i + 1) for i in range(len(doc["data"]))] == doc["data"]
