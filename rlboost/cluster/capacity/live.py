"""LiveCapacity: the fleet follows the Ray cluster's own preemptible nodes.

A thread reads the cluster's alive nodes every `cluster.live_poll_s`. Each node with the
`preemptible` resource (and not `reserved`) gets as many instances as it holds (one per
unit, as far as rollout.instance_cpus / instance_gpus go), placed on it by node affinity,
up to cluster.max_preemptible in all, and a notice agent (notices/agent.py) that hears the
node's cloud and shutdown hook. A notice drains the node's instances by the existing path
(Fleet.notice, with the cloud's deadline); a node that leaves or dies ends its instances
at once (their samples resume elsewhere); a node that joins again, or a new one, is used
at once. The autoscaler is asked for max_preemptible instances while the run runs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.cluster.capacity.autoscaler import ResourceRequest
from rlboost.cluster.capacity.nodes import InstanceSlot, PreemptibleNode, preemptible_nodes
from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.notices.agent import NodeNoticeAgent
from rlboost.cluster.notices.base import Notice

NOTICE_WAIT_S = 10.0  # one next_notice() call on an agent; another follows at once
RETRY_S = 10.0  # an instance that ended on a node that stays up is replaced after this long
CLOSE_WAIT_S = 3.0
MAX_FAILED_ROUNDS = 40  # rounds in a row that fail (Ray unreachable) before the run is told
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Node:
    node: PreemptibleNode
    agent: Any
    pending: Any = None  # ObjectRef of the agent's next_notice()
    source: str = ""  # the cloud its agent watches (known once it answered)
    leaving: bool = False  # noticed: no instance is placed on it again
    told_drained: bool = False
    broken: bool = False  # an instance failed to start there
    retry_at: float = 0.0
    placed: set = field(default_factory=set)  # its live instances this capacity started
    started: set = field(default_factory=set)
    count: int = 0  # instances placed on it so far (their ids' suffix)


class LiveCapacity:
    name = "live"

    def __init__(self, config: ClusterConfig, fleet: Any, *, slot: InstanceSlot, record: Callable[..., None],
                 say: Callable[[str], None]):
        self.config, self.fleet, self.slot = config, fleet, slot
        self.record, self.say = record, say
        self.request = ResourceRequest(slot.bundle(), config.max_preemptible) \
            if config.request_resources and config.max_preemptible > 0 else None
        self._nodes: dict[str, _Node] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-capacity", daemon=True)
        self.error: BaseException | None = None

    # -- the CapacitySource interface -----------------------------------------------------------

    def start(self, resume: dict | None = None) -> None:
        if self.request is not None:
            self.request.keep()
        self._sync()
        self.record("capacity", source="live", nodes=len(self._nodes),
                    requested=self.request.describe() if self.request is not None else None)
        if not self._nodes:
            asked = (f"; asked the autoscaler for {self.config.max_preemptible}" if self.request is not None else "")
            self.say("the Ray cluster has no node with the `preemptible` resource: the preemptible pool is empty and "
                     f"the reserved cluster trains alone until one joins{asked} (start one with "
                     "`ray start --address ... --resources='{\"preemptible\": 1}'`)")
        self._thread.start()

    def after_step(self, step: int, step_s: float, steps_left: int) -> None:
        pass

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"following the Ray cluster's nodes failed: {self.error!r}") from self.error

    def position(self) -> dict | None:
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=NOTICE_WAIT_S)
        if self.request is not None:
            self.request.withdraw()
        closing = []
        for state in self._nodes.values():
            try:
                closing.append(state.agent.close.remote())
            except Exception:  # its node is gone
                continue
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_WAIT_S)
        for state in self._nodes.values():
            try:
                ray.kill(state.agent)
            except Exception:
                pass
        self._nodes.clear()

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        failed = 0
        while not self._stop.is_set():
            try:
                self._hear(self.config.live_poll_s)
                if not self._stop.is_set():
                    self._sync()
                failed = 0
            except Exception as exc:  # Ray busy or restarting: try again next round
                failed += 1
                log.warning("live capacity round failed (%d in a row): %r", failed, exc)
                if failed >= MAX_FAILED_ROUNDS:
                    self.error = exc
                    return
                self._stop.wait(self.config.live_poll_s)

    def _sync(self) -> None:
        """Follow the cluster's nodes: departures, arrivals, instances that ended, placement."""
        alive = {n.node_id: n for n in preemptible_nodes(ray.nodes())}
        for node_id in [i for i in self._nodes if i not in alive]:
            self._left(node_id)
        for node_id, node in alive.items():
            if node_id not in self._nodes:
                self._joined(node)
        for node_id, state in self._nodes.items():
            self._settle(node_id, state)
        self._place()

    def _joined(self, node: PreemptibleNode) -> None:
        agent = ray.remote(NodeNoticeAgent).options(
            num_cpus=0, max_concurrency=4, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        ).remote(self.config.notices, node.notice_source(self.config.notice_source), node.node_id)
        state = _Node(node, agent)
        state.pending = agent.next_notice.remote(NOTICE_WAIT_S)
        self._nodes[node.node_id] = state
        self.record("node", action="joined", node=node.node_id, source="node",
                    slots=node.slots(self.slot), resources=dict(node.resources))

    def _left(self, node_id: str) -> None:
        state = self._nodes.pop(node_id)
        self.record("node", action="left", node=node_id, source="node")
        for iid in self.fleet.on_node(node_id):
            self.fleet.node_gone(iid)
        try:
            ray.kill(state.agent)
        except Exception:  # gone with its node
            pass

    def _settle(self, node_id: str, state: _Node) -> None:
        """Instances that failed to start or ended while their node stays up; a noticed
        node whose instances have all drained tells its agent (a waiting hook returns)."""
        live = set(self.fleet.on_node(node_id))
        for iid in sorted((state.placed - state.started) & live):
            done, error = self.fleet.start_outcome(iid)
            if error is not None:
                state.broken = True
                self.say(f"instance {iid} failed to start on node {node_id[:12]}: {error!r}; the node is not used")
                self.fleet.node_gone(iid)
                live.discard(iid)
            elif done:
                state.started.add(iid)
        ended = state.placed - live
        if ended and not state.leaving:
            state.retry_at = time.monotonic() + RETRY_S
        state.placed -= ended
        if state.leaving and not state.told_drained and all(self.fleet.settled(i) for i in live):
            state.agent.drained.remote()
            state.told_drained = True
            self.record("node", action="drained", node=node_id, source="node")

    def _place(self) -> None:
        free = self.config.max_preemptible - self.fleet.up("preemptible")
        now = time.monotonic()
        for node_id, state in self._nodes.items():
            if free <= 0:
                return
            if state.leaving or state.broken or now < state.retry_at:
                continue
            want = state.node.slots(self.slot) - len(self.fleet.on_node(node_id))
            while want > 0 and free > 0:
                iid = f"spot-{state.node.short}-{state.count}"
                state.count += 1
                self.fleet.join(iid, "preemptible", node=node_id, source="node")
                state.placed.add(iid)
                want, free = want - 1, free - 1

    def _hear(self, timeout_s: float) -> None:
        """Wait up to timeout_s for a notice from any node's agent; act on those that came."""
        refs = {s.pending: node_id for node_id, s in self._nodes.items() if s.pending is not None}
        if not refs:
            self._stop.wait(timeout_s)
            return
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            state = self._nodes.get(refs[ref])
            if state is None:
                continue
            try:
                notice = ray.get(ref)
            except Exception as exc:  # the agent died: with its node (seen next) or alone
                log.warning("the notice agent of node %s died: %r", refs[ref][:12], exc)
                state.pending = None
                continue
            if notice is not None:
                self._noticed(refs[ref], state, notice)
            state.pending = state.agent.next_notice.remote(NOTICE_WAIT_S)

    def _noticed(self, node_id: str, state: _Node, notice: Notice) -> None:
        source = "hook" if notice.source == "hook" else "cloud"
        cloud = {} if source == "hook" else {"cloud": notice.source}
        state.leaving = True
        self.record("node", action="noticed", node=node_id, source=source, grace_s=round(notice.grace_s, 3), **cloud)
        for iid in self.fleet.on_node(node_id):
            self.fleet.notice(iid, notice.grace_s, source=source, **cloud)
        if state.told_drained:  # a later hook's notice on a node already drained: it may return at once
            state.agent.drained.remote()
