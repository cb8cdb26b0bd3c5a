"""Spot-instance availability traces in one place: one step function of instance count over
time (availability.py) that every format is read into (readers.py, with the bundled
samples in cluster/data) or generated as (synthetic.py), the join / notice / kill events a
driver replays from it (preemptions.py), and their replay on a live fleet (replay.py; the
trace capacity source, cluster/capacity/trace.py, starts one).
"""

from rlboost.cluster.traces.availability import AvailabilityTrace
from rlboost.cluster.traces.preemptions import EVENT_KINDS, InstanceEvent, PreemptionPolicy, preemption_events
from rlboost.cluster.traces.readers import (
    MEASURED,
    READERS,
    SAMPLE_TRACE,
    SAMPLES,
    load_trace,
    read_bamboo_csv,
    read_count_csv,
    read_skypilot_json,
    read_spotserve_csv,
    read_spotserve_segment,
    sample_trace,
)
from rlboost.cluster.traces.synthetic import SyntheticTraceConfig, synthetic_trace

__all__ = ["EVENT_KINDS", "MEASURED", "READERS", "SAMPLES", "SAMPLE_TRACE", "AvailabilityTrace", "InstanceEvent",
           "PreemptionPolicy", "SyntheticTraceConfig", "load_trace", "preemption_events", "read_bamboo_csv",
           "read_count_csv", "read_skypilot_json", "read_spotserve_csv", "read_spotserve_segment",
           "sample_trace", "synthetic_trace"]
