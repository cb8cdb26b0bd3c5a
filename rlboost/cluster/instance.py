"""RolloutInstance: one rollout instance as a Ray actor (an engine, a WeightPuller, a
heartbeat thread and a pull thread).

The engine is the one the spec's rollout config names (rollout.factory builds it: the
embedded torch engine, SGLang, or an emulated engine that takes the time a configured
GPU would). The controller reaches it through the actor's RolloutEngine methods
and the handoff methods of MigratingEngine, so samples move engine to engine with their
KV pages (the controller sees only tickets and token states) when the engine can export
them. One thread registers the instance and heartbeats; another, whenever the lease names
another weight version, pulls it (from the trainer's publisher and from peers that
already hold it), loads it into the engine and has it reported: a pull that blocks never
delays a heartbeat. The puller's relay serves what the instance holds to its peers. An
instance starts with no weights loaded (version 0), so it always pulls before its first
sample.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import ray

from rlboost.controller.records import InstanceInfo
from rlboost.errors import RlboostError, TransferTimeout
from rlboost.transfer.config import on_this_node
from rlboost.validate import check_format_version

if TYPE_CHECKING:
    from rlboost.rollout.config import RolloutConfig
    from rlboost.transfer.config import TransferConfig

SPEC_FORMAT_VERSION = 1
PULL_RECORD_FORMAT_VERSION = 2
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceSpec:
    """What a rollout instance needs to start.

    >>> from rlboost.rollout.config import RolloutConfig
    >>> from rlboost.transfer.config import TransferConfig
    >>> InstanceSpec(instance_id="spot-0", kind="preemptible", model_dir="/ckpt/tiny", rollout=RolloutConfig(),
    ...              transfer=TransferConfig(secret=b"s"), sources=("127.0.0.1:7000",)).capacity
    64

    model_dir is the checkpoint whose shape the engine takes (its weights are not read, since
    every version comes from a pull); rollout says which engine (rollout.factory builds it);
    sources are the trainer's weight publishers.
    """

    instance_id: str
    kind: str
    model_dir: str
    rollout: RolloutConfig
    transfer: TransferConfig
    sources: tuple[str, ...]
    torch_threads: int = 1
    format_version: int = SPEC_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self, SPEC_FORMAT_VERSION)
        InstanceInfo(instance_id=self.instance_id, kind=self.kind, capacity=self.capacity)  # validates
        if not self.model_dir:
            raise ValueError("model_dir must name the checkpoint whose shape the engine takes")
        if not self.sources:
            raise ValueError("sources must name at least one weight publisher")

    @property
    def capacity(self) -> int:
        return self.rollout.capacity

    @property
    def pull_timeout_s(self) -> float:
        return self.rollout.pull_timeout_s


@dataclass(frozen=True, kw_only=True, slots=True)
class PullRecord:
    """One weight version pulled and loaded by an instance.

    >>> PullRecord(instance_id="spot-0", version=3, pull_s=0.2, load_s=0.01, nbytes=409856,
    ...            peer_bytes=0, kind="preemptible", bytes=2048, egress_bytes=2048, route="delta").version
    3

    nbytes is the version's size; bytes what the pull fetched (a delta, or the full
    version plus any delta tried first), of which peer_bytes came from peers' relays and
    egress_bytes from the trainer's publishers (the bytes that leave the trainer's
    region, which cost.egress_usd_per_gb prices for the instance's pool, `kind`).
    """

    instance_id: str
    version: int
    pull_s: float
    load_s: float
    nbytes: int
    peer_bytes: int
    kind: str = "preemptible"
    bytes: int = 0
    egress_bytes: int = 0
    route: str = "full"
    format_version: int = PULL_RECORD_FORMAT_VERSION


class RolloutInstance:
    """The actor class (wrap with ray.remote). controller is the RolloutController handle."""

    def __init__(self, spec: InstanceSpec, controller: Any):
        # The engine, the puller and torch are imported here, not with the module: a process
        # that only holds a handle to this actor (the controller) loads this module too.
        import torch

        from rlboost.rollout.factory import build_engine
        from rlboost.rollout.handoff.endpoint import MigratingEngine
        from rlboost.transfer.puller import WeightPuller

        torch.set_num_threads(spec.torch_threads)  # engines share a few cores with the trainer
        self.spec = spec
        self.controller = controller
        transfer = on_this_node(spec.transfer)
        self.engine = MigratingEngine(build_engine(spec.rollout, model_dir=spec.model_dir, kind=spec.kind),
                                      transfer)
        self.puller = WeightPuller(list(spec.sources), transfer)
        self._peers: tuple[str, ...] = ()
        self._pulls: list[PullRecord] = []
        self._held = None  # the last pulled version: its buffer is reused and relayed
        self._loading = threading.Lock()  # a version loads and is recorded as one step
        self._errors: list[str] = []
        self._loaded = 0  # the version the engine holds, as the heartbeats report it
        self._lease = None  # the controller's latest answer
        self._lease_cond = threading.Condition()
        self._stop = threading.Event()
        self._nudged = threading.Event()
        self._threads = [
            threading.Thread(target=self._run_heartbeats, name=f"beat-{spec.instance_id}", daemon=True),
            threading.Thread(target=self._run_pulls, name=f"pull-{spec.instance_id}", daemon=True)]
        for thread in self._threads:
            thread.start()

    # -- the RolloutEngine protocol, for the controller ---------------------------------------

    def submit(self, states) -> None:
        self.engine.submit(states)

    def poll(self, timeout_s: float):
        return self.engine.poll(timeout_s)

    def abort(self, sample_ids) -> None:
        self.engine.abort(sample_ids)

    def export_states(self, sample_ids=None, *, with_kv: bool = False):
        return self.engine.export_states(sample_ids, with_kv=with_kv)

    def import_states(self, batch) -> None:
        self.engine.import_states(batch)

    def load_weights(self, named_tensors, version: int) -> None:
        self.engine.load_weights(named_tensors, version)

    def load(self):
        return self.engine.load()

    # -- engine-to-engine handoffs (MigratingEngine), for the controller ----------------------

    def handoff_send(self, sample_ids, mode: str = "kv"):
        return self.engine.handoff_send(sample_ids, mode)

    def handoff_receive(self, ticket, sample_ids=None, timeout_s=None):
        self.engine.handoff_receive(ticket, sample_ids, timeout_s)

    def handoff_release(self, ticket, sample_ids=None) -> None:
        self.engine.handoff_release(ticket, sample_ids)

    def handoff_take_back(self, ticket, sample_ids=None) -> None:
        self.engine.handoff_take_back(ticket, sample_ids)

    def close(self) -> None:
        """The controller let the instance go (drained or shutting down): stop generating.
        The relay keeps serving what it holds until the process ends."""
        self._halt()
        self.engine.close()

    # -- management, for the fleet ------------------------------------------------------------

    def ready(self) -> str:
        """The relay address peers pull from (returns once the engine is built)."""
        return self.puller.relay_address or ""

    def set_peers(self, addresses: Sequence[str]) -> None:
        """Relays of other instances to pull from besides the trainer."""
        own = self.puller.relay_address
        self._peers = tuple(a for a in addresses if a != own)

    def pulls(self) -> list[PullRecord]:
        """Versions pulled so far; a version the engine already reports is listed."""
        with self._loading:
            return list(self._pulls)

    def nudge(self) -> None:
        """Heartbeat now rather than at the next beat (a new version was just published)."""
        self._nudged.set()

    def pull_errors(self) -> list[str]:
        """The errors of failed pulls so far (each one is retried at the next heartbeat)."""
        with self._loading:
            return list(self._errors)

    # -- agent --------------------------------------------------------------------------------

    def _run_heartbeats(self) -> None:
        """Registers, then renews the lease every half interval (or at once when nudged)
        from its own thread, so a pull that blocks (a frozen peer, a slow relay
        registration) never silences the instance."""
        try:
            me = ray.get_runtime_context().current_actor
            exports_kv = getattr(self.engine.engine, "exports_kv", True)
            info = InstanceInfo(instance_id=self.spec.instance_id, kind=self.spec.kind,
                                capacity=self.spec.capacity, address=self.puller.relay_address or "",
                                max_model_len=self.engine.max_model_len,
                                kv_layout=self.engine.kv_layout if exports_kv else None)
            ray.get(self.controller.register.remote(info, me))
            while not self._stop.is_set():
                self._nudged.clear()  # before the beat: a nudge during it brings the next one
                lease = ray.get(self.controller.heartbeat.remote(self.spec.instance_id, self._loaded))
                with self._lease_cond:
                    self._lease = lease
                    self._lease_cond.notify_all()
                self._nudged.wait(lease.renew_within_s / 2)
        except Exception as exc:  # the controller no longer knows us, or it is gone: stop
            log.info("instance %s stops heartbeating: %r", self.spec.instance_id, exc)
        finally:
            self._halt()

    def _run_pulls(self) -> None:
        """Pulls and loads whatever version the latest lease names; a failed pull is tried
        again after the next heartbeat, not at once."""
        try:
            seen = None
            while not self._stop.is_set():
                with self._lease_cond:
                    self._lease_cond.wait_for(lambda: self._stop.is_set() or self._lease is not seen)
                    lease = seen = self._lease
                if self._stop.is_set() or lease.weight_version == self._loaded \
                        or lease.state not in ("joining", "pulling", "active"):
                    continue
                try:
                    self._pull_and_load(lease.weight_version)
                    self._nudged.set()  # report the new version now
                except RlboostError as exc:  # e.g. a lost source
                    log.warning("instance %s: pull of version %d failed: %r", self.spec.instance_id,
                                lease.weight_version, exc)
                    with self._loading:
                        self._errors.append(f"version {lease.weight_version}: {exc!r}")
        except Exception as exc:  # a broken engine: stop, so the controller drops the instance
            log.error("instance %s stops pulling: %r", self.spec.instance_id, exc)
        finally:
            self._halt()

    def _halt(self) -> None:
        self._stop.set()
        self._nudged.set()
        with self._lease_cond:
            self._lease_cond.notify_all()

    def _pull_and_load(self, version: int) -> None:
        t0 = time.perf_counter()
        handle = self.puller.prepare(version, into=self._held,
                                     sources=[*self.spec.sources, *self._peers]).start()
        while not handle.poll(timeout=0.5):  # "not done yet", as opposed to a failed pull
            if self._stop.is_set() or time.perf_counter() - t0 > self.spec.pull_timeout_s:
                handle.cancel()
                raise TransferTimeout(f"pull of version {version} not done after "
                                      f"{time.perf_counter() - t0:.0f} s")
        pulled = handle.wait()  # the pull has ended: its weights, or its own error at once
        t1 = time.perf_counter()
        with self._loading:
            self.engine.load_weights(pulled, version)
            t2 = time.perf_counter()
            self._held = pulled
            self._loaded = version
            own, sources = set(self.spec.sources), pulled.stats.get("sources", [])
            trainer = sum(s["bytes"] for s in sources if s["address"] in own)
            fetched = sum(s["bytes"] for s in sources)
            self._pulls.append(PullRecord(instance_id=self.spec.instance_id, version=version, pull_s=t1 - t0,
                                          load_s=t2 - t1, nbytes=pulled.manifest.total_bytes,
                                          peer_bytes=fetched - trainer, kind=self.spec.kind, bytes=fetched,
                                          egress_bytes=trainer, route=pulled.stats.get("route", "full")))
