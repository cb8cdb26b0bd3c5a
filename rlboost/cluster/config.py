"""ClusterConfig: where a run's processes live and how preemptible capacity comes and goes
(an availability trace or the Ray cluster's own nodes, notices, injected preemptions)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.cluster.notices.base import NOTICE_SOURCES, NoticeConfig
from rlboost.validate import require

VICTIM_ORDERS = ("oldest", "newest", "random")
INJECT_KINDS = ("notice", "kill")
CAPACITY_KINDS = ("auto", "trace", "live")


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """The Ray cluster of a run and its preemptible capacity.

    A run that joins a Ray cluster (address, or RLBOOST_RAY_ADDRESS) spans machines, so it
    needs weight servers reachable from other nodes, a secret, and trainer.rendezvous=tcp or
    a shared trainer.rendezvous_dir.

    capacity says where preemptible instances come from. trace: the trace, capped at
    max_preemptible (less initial_preemptible) and replayed from the end of the run's first
    step. live: the joined cluster's nodes with the `preemptible` resource, up to
    max_preemptible instances, each node's notices from notice_source (a node's Ray label
    `rlboost.io/notice-source` overrides it), and a standing request to Ray's autoscaler
    (request_resources). auto: live on a joined cluster, trace on a local one.

    >>> ClusterConfig(max_preemptible=4, inject=("notice@2",)).inject
    ('notice@2',)
    """

    address: str | None = None
    """Ray cluster to join (None: RLBOOST_RAY_ADDRESS, else a local cluster)"""
    num_cpus: int | None = None
    """CPUs of a local Ray cluster (None: all of this machine's)"""
    object_store_mb: int = 256
    """object store of a local Ray cluster, MiB (bulk weights never go through it)"""
    reserved_instances: int = 1
    """reserved rollout engines, on the reserved cluster beside the trainer"""
    max_preemptible: int = 3
    """most preemptible instances up at once"""
    initial_preemptible: int = 0
    """preemptible instances that join at the start, besides the trace's"""
    capacity: str = "auto"
    """where preemptible instances come from: trace, live (the joined Ray cluster's nodes) or auto"""
    notice_source: str = "auto"
    """live: where each node hears its preemption notice: aws, gcp, azure, none, or auto (probe each once)"""
    notices: NoticeConfig = field(default_factory=NoticeConfig)
    """live: the metadata services' base URLs, poll interval and the nodes' notice sockets"""
    request_resources: bool = True
    """live: ask Ray's autoscaler for max_preemptible instances while the run runs"""
    live_poll_s: float = 0.5
    """live: seconds between two looks at the Ray cluster's nodes"""
    trace: str = "sample"
    """availability trace: sample (bundled), synthetic, none, or a trace file"""
    trace_duration_s: float | None = None
    """seconds the trace is replayed over (None: a file or measured trace at its own pace, a synthetic one in trace_fraction of the run)"""
    trace_fraction: float = 0.6
    """share of the run a synthetic trace is compressed into when trace_duration_s is None"""
    notice_s: float | None = None
    """warning a noticed preemption gives, seconds (None: the trace's cloud's, aws 120, gcp and azure 30; else 8)"""
    preempt_busy_wait_s: float = 0.0
    """a trace preemption waits up to this long for its victim to hold samples (0: trace times)"""
    sudden_fraction: float = 0.5
    """share of the trace's preemptions that come without notice"""
    victim_order: str = "oldest"
    """which instance a trace preemption takes: oldest, newest or random"""
    inject: tuple[str, ...] = ()
    """extra preemptions of the oldest preemptible instance, e.g. notice@2,kill@3"""
    seed: int = 0
    """seed of the trace's synthetic capacity, victims and notice kinds"""

    def __post_init__(self) -> None:
        require(self.num_cpus is None or self.num_cpus >= 1, "num_cpus", "None or >= 1", self.num_cpus)
        require(self.object_store_mb >= 64, "object_store_mb", ">= 64", self.object_store_mb)
        require(self.reserved_instances >= 1, "reserved_instances", ">= 1", self.reserved_instances)
        require(0 <= self.max_preemptible <= 1024, "max_preemptible", "in [0, 1024]", self.max_preemptible)
        require(0 <= self.initial_preemptible <= self.max_preemptible, "initial_preemptible",
                f"in [0, max_preemptible={self.max_preemptible}]", self.initial_preemptible)
        require(self.capacity in CAPACITY_KINDS, "capacity", f"one of {CAPACITY_KINDS}", self.capacity)
        require(self.notice_source in NOTICE_SOURCES, "notice_source", f"one of {NOTICE_SOURCES}", self.notice_source)
        require(isinstance(self.request_resources, bool), "request_resources", "true or false",
                self.request_resources)
        require(0.05 <= self.live_poll_s <= 60, "live_poll_s", "in [0.05, 60]", self.live_poll_s)
        require(bool(self.trace), "trace", "sample, synthetic, none or a file", self.trace)
        require(self.trace_duration_s is None or self.trace_duration_s > 0, "trace_duration_s",
                "None or > 0", self.trace_duration_s)
        require(0.0 < self.trace_fraction <= 1.0, "trace_fraction", "in (0, 1]", self.trace_fraction)
        require(self.notice_s is None or self.notice_s >= 0, "notice_s", "None or >= 0", self.notice_s)
        require(self.preempt_busy_wait_s >= 0, "preempt_busy_wait_s", ">= 0", self.preempt_busy_wait_s)
        require(0.0 <= self.sudden_fraction <= 1.0, "sudden_fraction", "in [0, 1]", self.sudden_fraction)
        require(self.victim_order in VICTIM_ORDERS, "victim_order", f"one of {VICTIM_ORDERS}",
                self.victim_order)
        for item in self.inject:
            parse_injection(item)


def parse_injection(item: str) -> tuple[str, int]:
    """'notice@2' -> ('notice', 2); ValueError naming the field otherwise."""
    kind, sep, step = item.partition("@")
    if not sep or kind not in INJECT_KINDS or not step.isdigit() or int(step) < 1:
        raise ValueError(f"cluster.inject entries must look like 'notice@STEP' or 'kill@STEP' "
                         f"(STEP >= 1), got {item!r}")
    return kind, int(step)
