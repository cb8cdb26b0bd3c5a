"""Starting or joining the Ray cluster of a run, and where each kind of actor goes.

A local cluster gets the custom resources `reserved` and `preemptible` (actors ask for
one unit of their kind) and small CPU demands: on a 2-core machine two actors asking
for one CPU each would leave every later actor waiting forever.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import ray
from ray._private import ray_constants
from ray._raylet import Config as RayConfig
from ray.exceptions import AuthenticationError

from rlboost import env
from rlboost.cluster.placement import GpuNeeds, check_cluster
from rlboost.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class RaySettings:
    """How the run's Ray cluster is found or started.

    address: join this cluster (None: RLBOOST_RAY_ADDRESS (see join_address), else start a
    local one with num_cpus CPUs (None: all), `reserved` and `preemptible` units and an
    object store of object_store_mb; bulk weights never go through it). worker_dir: the
    working directory of the run's Ray workers on this machine (None: the system's temporary
    folder); never the caller's, see `_workers_start_in`. gpus: what the run's actors ask
    for, checked against a joined cluster's nodes (a local one is checked before it starts).
    preemptible_required: a joined cluster must offer `preemptible` units now (False: live
    capacity, whose preemptible nodes may join later).
    """

    address: str | None = None
    num_cpus: int | None = None
    reserved: int = 4
    preemptible: int = 8
    object_store_mb: int = 256
    worker_dir: str | None = None
    gpus: GpuNeeds | None = None
    preemptible_required: bool = True

    def __post_init__(self) -> None:
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ValueError(f"num_cpus must be None or >= 1, got {self.num_cpus}")
        if self.reserved < 1 or self.preemptible < 0:
            raise ValueError(f"reserved must be >= 1 and preemptible >= 0, got {self.reserved}, "
                             f"{self.preemptible}")
        if self.object_store_mb < 64:
            raise ValueError(f"object_store_mb must be >= 64, got {self.object_store_mb}")


class RaySession:
    """Context manager: ray.init on enter (unless Ray is already up), ray.shutdown on exit
    (only if it started Ray)."""

    def __init__(self, settings: RaySettings):
        self.settings = settings
        self._owned = False
        self._node_constant: bool | None = None  # Ray's own value, restored on exit

    def __enter__(self) -> RaySession:
        if ray.is_initialized():
            check_resources(ray.cluster_resources(), self.settings)
            return self
        s = self.settings
        address = join_address(s.address)
        if address:
            _token_auth_by_default()
            try:
                with _workers_start_in(s.worker_dir):
                    ray.init(address=address, log_to_driver=False)
            except AuthenticationError as exc:
                raise ConfigError(f"cannot join the Ray cluster at {address} with Ray's token authentication "
                                  f"(RAY_AUTH_MODE={env.ray_auth_mode()}): {' '.join(str(exc).split())[:300]}; copy "
                                  "the cluster's token (`ray get-auth-token` on its head) to ~/.ray/auth_token or "
                                  "RAY_AUTH_TOKEN, or set RAY_AUTH_MODE=disabled for a cluster without it") from None
            except ConnectionError as exc:
                raise ConfigError(f"cannot join the Ray cluster at {address}: {exc}; start it with `ray start "
                                  "--head` or set cluster.address / RLBOOST_RAY_ADDRESS to a running one") from None
            self._owned = True
            try:  # a cluster without the run's resources would leave its actors pending forever
                check_resources(ray.cluster_resources(), s)
                if s.gpus is not None:
                    check_cluster(s.gpus, [n["Resources"] for n in ray.nodes() if n.get("Alive")])
            except BaseException:
                self.__exit__()
                raise
        else:
            self._node_constant = _node_on_loopback(env.apply_ray_defaults())
            try:
                with _workers_start_in(s.worker_dir):
                    # address="local": always a cluster of the run's own, even when another Ray
                    # cluster runs on this machine (a bare ray.init() would join that one).
                    ray.init(address="local", num_cpus=s.num_cpus,
                             resources={"reserved": s.reserved, "preemptible": s.preemptible},
                             object_store_memory=s.object_store_mb << 20, include_dashboard=False,
                             log_to_driver=False)
            except Exception as exc:
                self.__exit__()
                if type(exc) in (Exception, RuntimeError, TimeoutError):  # how Ray says its processes did not start
                    raise ConfigError(_local_start_failed(exc)) from exc
                raise
            except BaseException:
                self.__exit__()
                raise
            self._owned = True
        return self

    def __exit__(self, *exc) -> None:
        if self._owned:
            ray.shutdown()
            self._owned = False
        if self._node_constant is not None:
            ray_constants.ENABLE_RAY_CLUSTER = self._node_constant
            self._node_constant = None


def _local_start_failed(exc: Exception) -> str:
    """The line for a local Ray cluster whose processes did not start (Ray raises a bare
    Exception when its GCS or raylet misses the start deadline, most often on a loaded machine)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"Ray's local cluster did not start: {' '.join(str(exc).split())[:300]} (load average {load:.1f} "
            f"on {os.cpu_count()} cores); nothing of the run has started: run it again when the machine is less "
            "busy, or start a cluster with `ray start --head` and set cluster.address to it")


def _token_auth_by_default() -> None:
    """A run that joins a Ray cluster speaks Ray's token authentication unless RAY_AUTH_MODE
    says otherwise (Ray 2.60 turns it on by itself only for a cluster ray.init() starts). Ray
    reads the mode into its config when first used, so the config is refreshed here, as
    Ray's own ray.init does when it turns authentication on for a local cluster."""
    if env.ray_auth_mode() is None:
        env.apply_ray_auth_default()
        RayConfig.initialize("")


def _node_on_loopback(defaults: dict[str, str]) -> bool:
    """Make this process start its node on 127.0.0.1 when RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
    says so; returns Ray's previous setting. Ray reads the variable once, when `ray` is first
    imported (`ray_constants.ENABLE_RAY_CLUSTER`), which in `rlboost train` comes long before
    the run starts: set only in the environment, it reaches the processes Ray starts, while
    this process still gives the node the machine's address, and the GCS, the raylet and
    every worker listen on all interfaces. tests/cluster/test_loopback.py checks the sockets."""
    previous = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = defaults[env.RAY_LOOPBACK_VARIABLE].lower() in ("1", "true")
    return previous


@contextmanager
def _workers_start_in(folder: str | None) -> Iterator[None]:
    """Run ray.init from `folder`. Ray puts the driver's working directory first on every
    worker's sys.path and starts workers there: from a clone's root that is the source folder
    `rlboost/`, without the compiled core the installed package has, so every actor would
    fail to import. Paths the driver hands to workers are absolute."""
    previous = os.getcwd()
    os.chdir(folder or tempfile.gettempdir())
    try:
        yield
    finally:
        os.chdir(previous)


def join_address(configured: str | None) -> str | None:
    """The Ray cluster a run joins: the configured address, else RLBOOST_RAY_ADDRESS; None
    when the run starts a local cluster of its own."""
    return configured or env.ray_address()


def check_resources(have: dict, settings: RaySettings) -> None:
    """ConfigError, saying what to start the cluster with, unless it offers `reserved`
    units for every trainer rank and reserved engine and (unless not required) some
    `preemptible` units."""
    reserved, preemptible = have.get("reserved", 0), have.get("preemptible", 0)
    if reserved < settings.reserved or (preemptible <= 0 and settings.preemptible_required):
        raise ConfigError(
            f"the Ray cluster offers reserved={reserved:g} and preemptible={preemptible:g} units; this run "
            f"needs reserved >= {settings.reserved} (trainer ranks + reserved engines) and preemptible >= 1. "
            f"Start its nodes with e.g. `ray start --resources='{{\"reserved\": {settings.reserved}}}'` on "
            "reserved nodes and `--resources='{\"preemptible\": 1}'` on each preemptible one")


def actor_options(kind: str, *, cpus: float = 0.0, gpus: float = 0.0, **extra) -> dict:
    """Ray options of an actor on a node of the given kind ("reserved" or "preemptible")."""
    if kind not in ("reserved", "preemptible"):
        raise ValueError(f"kind must be reserved or preemptible, got {kind!r}")
    return {"num_cpus": cpus, "num_gpus": gpus, "resources": {kind: 1}, "max_restarts": 0, **extra}


def process_info(_actor: Any = None) -> dict:
    """{"pid", "node"} of the calling process (run inside an actor with __ray_call__), so
    the run's events say which process each instance, the controller and each trainer
    rank was: what to look for in Ray's logs when one dies. It lives here, in a module
    without torch, because the actor that runs it imports the module it comes from."""
    return {"pid": os.getpid(), "node": ray.util.get_node_ip_address()}
