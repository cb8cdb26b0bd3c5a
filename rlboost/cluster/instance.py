"""RolloutInstance: one rollout instance as a Ray actor. It owns its engine and both ends of
its handoffs (an EngineHost: the controller calls engine_call on it), a WeightPuller whose
relay serves what it holds to its peers, and two threads: one registers with the
controller and renews the lease, the other pulls and loads whatever version the lease
names, from the trainer's publishers and the peers the lease lists. The controller also
pushes a new lease the moment a version is current (renew).

The engine is the one the spec's rollout config names (rollout.factory builds it: the
embedded torch engine, SGLang, vLLM, or an emulated engine that takes the time a
configured GPU would). An engine that fails to start, or to load a version, is reported
to the controller with its cause in one line (the driver then hears it as an event), and
the instance stops. An instance starts with no weights loaded, so it always pulls before
its first sample; a pull that fails is tried again at the next lease.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rlboost.cluster.session import process_info
from rlboost.controller.records import InstanceInfo, Lease
from rlboost.errors import EngineBusy, InstanceFailed, RlboostError, TransferTimeout
from rlboost.transfer.config import on_this_node
from rlboost.validate import check_format_version

if TYPE_CHECKING:
    from rlboost.rollout.config import RolloutConfig
    from rlboost.transfer.config import TransferConfig

SPEC_FORMAT_VERSION = 2
IDLE_CHECK_S = 0.02  # how often a pulled version waits for the engine to go idle
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
    sources are the trainer's weight publishers; source says who placed it (its events'
    `source`).
    """

    instance_id: str
    kind: str
    model_dir: str
    rollout: RolloutConfig
    transfer: TransferConfig
    sources: tuple[str, ...]
    source: str = ""
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


def one_line(exc: BaseException) -> str:
    """An exception as the one line a user reads: its type and the first line of its text."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class RolloutInstance:
    """The actor class (wrap with ray.remote). controller is the RolloutController handle."""

    def __init__(self, spec: InstanceSpec, controller: Any):
        self.spec, self.controller = spec, controller
        self.host = self.puller = None
        self._failure: str | None = None
        self._pulls: list[PullRecord] = []
        self._errors: list[str] = []
        self._held = None  # the last pulled version: its buffer is reused and relayed
        self._loading = threading.Lock()  # a version loads and is recorded as one step
        self._loaded = 0  # the version the engine holds, as the heartbeats report it
        self._lease: Lease | None = None  # the controller's latest word
        self._lease_cond = threading.Condition()
        self._stop = threading.Event()
        self._nudged = threading.Event()
        try:
            self._start_engine()
        except Exception as exc:  # reported with its cause; ready() raises it
            self._fail(f"its engine failed to start: {one_line(exc)}")
            return
        self._threads = [
            threading.Thread(target=self._run_heartbeats, name=f"beat-{spec.instance_id}", daemon=True),
            threading.Thread(target=self._run_pulls, name=f"pull-{spec.instance_id}", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _start_engine(self) -> None:
        # The engine, the puller and torch are imported here, not with the module: a process
        # that only holds a handle to this actor (the controller) loads this module too.
        import torch

        from rlboost.rollout.factory import build_engine
        from rlboost.rollout.host import EngineHost
        from rlboost.transfer.puller import WeightPuller

        torch.set_num_threads(self.spec.torch_threads)  # engines share a few cores with the trainer
        transfer = on_this_node(self.spec.transfer)
        engine = build_engine(self.spec.rollout, model_dir=self.spec.model_dir, kind=self.spec.kind)
        self.host = EngineHost(engine, transfer, handoff=True)
        self.puller = WeightPuller(list(self.spec.sources), transfer)

    # -- for the controller ---------------------------------------------------------------------

    def engine_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One call of the engine or handoff protocol (controller.adapters.RayEngineHandle)."""
        if method == "close":  # the controller let the instance go: stop generating; the
            self._halt()       # relay keeps serving what it holds until the process ends
        return self.host.engine_call(method, *args, **kwargs)

    def renew(self, lease: Lease) -> None:
        """A lease pushed by the controller (a new version is current): acted on at once."""
        with self._lease_cond:
            self._lease = lease
            self._lease_cond.notify_all()

    # -- for the fleet ------------------------------------------------------------------------

    def ready(self) -> str:
        """Returns once the engine is built (its relay address; InstanceFailed if it failed)."""
        if self._failure is not None:
            raise InstanceFailed(f"instance {self.spec.instance_id}: {self._failure}")
        return self.puller.relay_address or ""

    def pulls(self) -> list[PullRecord]:
        """Versions pulled so far; a version the engine already reports is listed."""
        with self._loading:
            return list(self._pulls)

    def pull_errors(self) -> list[str]:
        """The errors of failed pulls so far (each one is tried again at the next lease)."""
        with self._loading:
            return list(self._errors)

    # -- agent --------------------------------------------------------------------------------

    def _info(self) -> InstanceInfo:
        where = process_info()
        return InstanceInfo(instance_id=self.spec.instance_id, kind=self.spec.kind, capacity=self.spec.capacity,
                            relay_address=self.puller.relay_address or "", max_model_len=self.host.max_model_len,
                            kv_layout=self.host.kv_layout, source=self.spec.source, pid=where["pid"],
                            host=where["node"])

    def _run_heartbeats(self) -> None:
        """Registers, then renews the lease every half interval (or at once when nudged)
        from its own thread, so a pull that blocks (a frozen peer, a slow relay
        registration) never silences the instance."""
        try:
            me = ray.get_runtime_context().current_actor
            ray.get(self.controller.register.remote(self._info(), me))
            while not self._stop.is_set():
                self._nudged.clear()  # before the beat: a nudge during it brings the next one
                lease = ray.get(self.controller.heartbeat.remote(self.spec.instance_id, self._loaded))
                self.renew(lease)
                self._nudged.wait(lease.renew_within_s / 2)
        except Exception as exc:  # the controller no longer knows us, or it is gone: stop
            log.info("instance %s stops heartbeating: %r", self.spec.instance_id, exc)
        finally:
            self._halt()

    def _run_pulls(self) -> None:
        """Pulls and loads whatever version the latest lease names, from the trainer and the
        lease's peers; a failed pull is tried again at the next lease, not at once. A load
        that fails is the engine's failure: reported, and the instance stops."""
        seen = None
        while not self._stop.is_set():
            with self._lease_cond:
                self._lease_cond.wait_for(lambda: self._stop.is_set() or self._lease is not seen)
                lease = seen = self._lease
            if self._stop.is_set() or lease.weight_version == self._loaded \
                    or lease.state not in ("joining", "pulling", "active") or self._busy():
                continue
            try:
                pulled, pull_s = self._pull(lease.weight_version, lease.peers)
            except RlboostError as exc:  # e.g. a lost source, a timeout: tried again at the next lease
                log.warning("instance %s: pull of version %d failed: %r", self.spec.instance_id,
                            lease.weight_version, exc)
                with self._loading:
                    self._errors.append(f"version {lease.weight_version}: {exc!r}")
                continue
            try:
                if not self._load_once_idle(pulled, lease.weight_version, pull_s):
                    return
            except Exception as exc:  # noqa: BLE001 - whatever the engine raised is the cause
                self._fail(f"its engine failed to load weight version {lease.weight_version}: {one_line(exc)}")
                return
            self._nudged.set()  # report the new version now

    def _load_once_idle(self, pulled: Any, version: int, pull_s: float) -> bool:
        """Load the pulled version as soon as the engine is idle; False if the instance stops
        first. The engine may still hold samples when the pull ends: finished ones the
        controller has not collected yet (an emulated or server engine keeps them until
        polled), or ones it sent just before the version was published. It sends nothing more
        to an instance a version behind, so they finish, are collected or move off, and the
        load follows."""
        while True:
            try:
                self._load(pulled, version, pull_s)
                return True
            except EngineBusy:  # running, or done and not yet collected (engine.load() counts only the former)
                while True:
                    if self._stop.wait(IDLE_CHECK_S):
                        return False
                    if not self._busy():
                        break

    def _busy(self) -> bool:
        """Samples still run (one version behind, under bounded staleness): load once idle."""
        load = self.host.engine.load()
        return load.running + load.queued > 0

    def _fail(self, cause: str) -> None:
        log.error("instance %s: %s", self.spec.instance_id, cause)
        self._failure = cause
        self._halt()
        try:
            self.controller.failed.remote(self.spec.instance_id, cause)
        except Exception:  # the controller is gone: the run is failing anyway
            pass

    def _halt(self) -> None:
        self._stop.set()
        self._nudged.set()
        with self._lease_cond:
            self._lease_cond.notify_all()

    def _pull(self, version: int, peers: tuple[str, ...]) -> tuple[Any, float]:
        """The version's weights, from the trainer's publishers and the peers' relays, and
        the seconds the pull took."""
        t0 = time.perf_counter()
        handle = self.puller.prepare(version, into=self._held, sources=[*self.spec.sources, *peers]).start()
        while not handle.poll(timeout=0.5):  # "not done yet", as opposed to a failed pull
            if self._stop.is_set() or time.perf_counter() - t0 > self.spec.pull_timeout_s:
                handle.cancel()
                raise TransferTimeout(f"pull of version {version} not done after "
                                      f"{time.perf_counter() - t0:.0f} s")
        return handle.wait(), time.perf_counter() - t0  # its weights, or its own error at once

    def _load(self, pulled: Any, version: int, pull_s: float) -> None:
        with self._loading:
            t0 = time.perf_counter()
            self.host.engine.load_weights(pulled, version)
            load_s = time.perf_counter() - t0
            self._held = pulled
            self._loaded = version
            own, sources = set(self.spec.sources), pulled.stats.get("sources", [])
            trainer = sum(s["bytes"] for s in sources if s["address"] in own)
            fetched = sum(s["bytes"] for s in sources)
            self._pulls.append(PullRecord(instance_id=self.spec.instance_id, version=version, pull_s=pull_s,
                                          load_s=load_s, nbytes=pulled.manifest.total_bytes,
                                          peer_bytes=fetched - trainer, kind=self.spec.kind, bytes=fetched,
                                          egress_bytes=trainer, route=pulled.stats.get("route", "full")))
