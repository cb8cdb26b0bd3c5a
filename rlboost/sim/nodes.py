"""The simulated instances: each one's engine schedule and measured rates (what the controller's
StepDecisions reads from its engine table), its life (placed, started, pulling, gone), what
it is billed, and how long its weight pulls take.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass

from rlboost.cluster.cost import CostLedger
from rlboost.controller.config import ControllerConfig
from rlboost.controller.estimates import RateModel
from rlboost.rollout.emulated.pace import RooflinePace
from rlboost.rollout.emulated.schedule import BatchSchedule
from rlboost.sim.spec import SimSpec


@dataclass(slots=True)
class SimNode:
    """One instance: its engine's schedule and what the controller has measured of it."""

    instance_id: str
    kind: str
    schedule: BatchSchedule
    rates: RateModel | None = None  # set once it registers (the controller knows it)
    placed_at: float = 0.0
    version: int = 0
    pull_done_at: float | None = None
    pulling: int | None = None
    alive: bool = True
    polled_at: float = 0.0
    decoded_at_poll: float = 0.0
    stamp: int = 0  # bumped at every change of its schedule (older due entries are stale)
    bases: dict = dataclasses.field(default_factory=dict)  # sample -> progress when it arrived


class SimTable:
    """The instances the controller drives (StepDecisions reads `in` and rates(id) from it).

    A newcomer's rates start from those measured on its kind, else from the config's
    priors, as controller.engines.EngineTable.add does for a real engine.
    """

    def __init__(self, config: ControllerConfig):
        self.config = config
        self.nodes: dict[str, SimNode] = {}
        self._due: list[tuple[float, int, str]] = []  # (next event of a node's schedule, stamp, id)

    def __contains__(self, instance_id: str) -> bool:
        node = self.nodes.get(instance_id)
        return node is not None and node.rates is not None

    @staticmethod
    def holds(sample_id: int) -> bool:
        """Whether the sample's KV pages wait on an engine for its next placement: never here
        (a simulated move re-prefills the tokens the sample holds)."""
        return False

    def rates(self, instance_id: str) -> RateModel:
        return self.nodes[instance_id].rates

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.rates is not None]

    def register(self, node: SimNode, now: float) -> None:
        node.rates = self.config.start_rates(
            node.kind, [n.rates for n in self.nodes.values() if n.kind == node.kind and n.rates is not None])
        node.polled_at = now
        node.decoded_at_poll = node.schedule.decoded

    def remove(self, instance_id: str) -> None:
        node = self.nodes.get(instance_id)
        if node is not None:
            node.rates = None

    def observe(self, node: SimNode, now: float, running: int) -> None:
        """The node's tokens since its last observation (with `running` samples on it) feed its
        rate model."""
        if node.rates is None:
            return
        tokens = node.schedule.decoded - node.decoded_at_poll
        node.rates.observe(int(tokens), now - node.polled_at, running)
        node.polled_at, node.decoded_at_poll = now, node.schedule.decoded

    # -- when each node's schedule next changes by itself (a sample starts or ends decoding) -----

    def touch(self, node: SimNode) -> None:
        """The node's schedule changed: file its next event."""
        node.stamp += 1
        at = node.schedule.next_event_at() if len(node.schedule) else math.inf
        if at < math.inf:
            heapq.heappush(self._due, (at, node.stamp, node.instance_id))

    def due(self, now: float) -> list[SimNode]:
        """Live nodes whose schedule has an event by now (each once), in id order: the order
        in which a live controller's round takes its engines' answers (EngineTable.answered)."""
        out, seen = [], set()
        while self._due and self._due[0][0] <= now:
            _, stamp, iid = heapq.heappop(self._due)
            node = self.nodes.get(iid)
            if node is not None and node.stamp == stamp and node.rates is not None and iid not in seen:
                seen.add(iid)
                out.append(node)
        return sorted(out, key=lambda n: n.instance_id)

    def next_due(self) -> float:
        while self._due:
            at, stamp, iid = self._due[0]
            node = self.nodes.get(iid)
            if node is not None and node.stamp == stamp and node.rates is not None:
                return at
            heapq.heappop(self._due)
        return math.inf


class WeightLink:
    """How long a weight pull takes: the payload over the trainer's egress cap. Without
    relays every puller shares the trainer's egress (it serves them one after another);
    with them, peers that hold a version serve it too and each pull takes one payload time
    (the relay bench measured 1.12 s for 4 newcomers against a 0.89 s single-pull floor)."""

    def __init__(self, spec: SimSpec, payload_bytes: int):
        egress = spec.transfer.publisher.egress_bytes_per_s
        self.one_s = payload_bytes / egress if egress else 0.0
        self.relay = spec.transfer.relay
        self._egress_free_at = 0.0

    def pull_done_at(self, now: float) -> float:
        if self.relay:
            return now + self.one_s
        self._egress_free_at = max(now, self._egress_free_at) + self.one_s
        return self._egress_free_at


class SimNodes:
    """Placing, starting, billing and ending instances (the controller's registry is told by
    the simulator, as a real instance tells the controller)."""

    def __init__(self, spec: SimSpec, table: SimTable, ledger: CostLedger):
        self.spec, self.table, self.ledger = spec, table, ledger
        emu = spec.rollout.emulated
        self.paces = {kind: RooflinePace(emu, kind=kind) for kind in ("reserved", "preemptible")}
        self.startup_s = emu.startup_s / emu.time_scale
        self.speed = {"reserved": spec.decode_speed, "preemptible": spec.decode_speed * emu.preemptible_speed}

    def place(self, instance_id: str, kind: str, now: float) -> SimNode:
        """A new instance starts billing now; it registers once started (starts_at)."""
        speed = self.speed[kind]
        emu = self.spec.rollout.emulated
        schedule = BatchSchedule(self.paces[kind], emu.max_running, now=now, speed=speed, rate_window_s=emu.rate_window_s,
                                 kv_capacity=emu.kv_capacity(kind))
        node = SimNode(instance_id=instance_id, kind=kind, schedule=schedule, placed_at=now)
        self.table.nodes[instance_id] = node
        if kind == "preemptible":
            self.ledger.start(instance_id, kind, at_s=now)
        return node

    def starts_at(self, node: SimNode) -> float:
        return node.placed_at + (self.startup_s if node.kind == "preemptible" else 0.0)

    def end(self, instance_id: str, now: float) -> None:
        """The instance is reclaimed: its billing stops (the caller settles its samples first)."""
        node = self.table.nodes.get(instance_id)
        if node is None or not node.alive:
            return
        node.alive = False
        self.table.remove(instance_id)
        if node.kind == "preemptible":
            self.ledger.stop(instance_id, at_s=now)
